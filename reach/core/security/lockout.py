"""Failed authentications per client: when an address is locked out, and for how long.

A client address (IPv4, or an IPv6 /64: one host usually holds a whole /64) that failed to
authenticate ``max_failures`` times within ``window_s`` is locked out until the oldest of
those failures leaves the window: its credentials are not checked meanwhile (a 429 with
``Retry-After``), so guessing runs at ``max_failures`` per window instead of hundreds a
second. Other addresses, and the keys they present, are never affected. Successes do not
clear failures (a client holding one valid key would otherwise guess between its uses).

Pure: the caller keeps the failure times and passes the clock in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LockoutPolicy:
    """``max_failures`` failed authentications within ``window_s`` lock an address out."""

    max_failures: int = 30
    window_s: float = 60.0


def client_key(host: str | None) -> str:
    """Whose failures these are: the IPv4 address, the IPv6 /64, or the host as given
    (a Unix socket's peer, a test client: one bucket each)."""
    if not host:
        return "-"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def locked_for(failures: Sequence[float], now: float, policy: LockoutPolicy) -> float | None:
    """Seconds until an address with these failure times (oldest first) may try again, or
    None when it may try now."""
    recent = [t for t in failures if t > now - policy.window_s]
    if len(recent) < policy.max_failures:
        return None
    return recent[-policy.max_failures] + policy.window_s - now
