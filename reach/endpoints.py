"""Parsing of agent addresses, and the loopback rule.

The hub probes and delivers from *its* network position, so an address that only means
something on the agent's own machine (127.0.0.1, localhost, ::1, 0.0.0.0) is refused
unless the agent opts in explicitly for local development.
"""

from __future__ import annotations

import ipaddress
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
        if self.host.lower() in _LOOPBACK_NAMES or self.host.lower().endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def is_unspecified(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_unspecified
        except ValueError:
            return False


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
