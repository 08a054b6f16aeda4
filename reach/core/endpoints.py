"""Parsing of agent addresses, and the loopback rule.

The hub probes and delivers from *its* network position, so an address that only means
something on the agent's own machine (127.0.0.1, localhost, ::1, 0.0.0.0) is refused
unless the agent opts in explicitly for local development.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    @property
    def is_loopback(self) -> bool:
        name = self.host.lower().rstrip(".")
        if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        ip = _as_ip(self.host)
        return ip is not None and ip.is_loopback

    @property
    def is_unspecified(self) -> bool:
        ip = _as_ip(self.host)
        return ip is not None and ip.is_unspecified


def _as_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a resolver would use if ``host`` is an IP literal in any spelling
    (inet_aton forms such as 127.1, 2130706433 or 0x7f.1, and IPv4-mapped IPv6)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not host or not all(c in "0123456789abcdefxABCDEFX." for c in host):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def parse_endpoint(value: str) -> Endpoint:
    """Parse ``host:port``, ``[v6]:port`` or ``http(s)://host:port[/path]``; ValueError if not."""
    text = value.strip()
    if not text:
        raise ValueError("address is empty")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        raise ValueError(f"unsupported scheme {parts.scheme!r} (use http or https)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("address must not carry credentials, a query or a fragment")
    host = parts.hostname
    if not host:
        raise ValueError(f"address {value!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"address {value!r} has an invalid port") from None
    if port is None:
        raise ValueError(f"address {value!r} must name a port (host:port)")
    if port == 0:
        raise ValueError(f"address {value!r} has port 0")
    return Endpoint(parts.scheme, host, port, parts.path.rstrip("/"))
