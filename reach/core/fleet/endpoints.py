"""Parsing of agent addresses, and the loopback rule.

The hub probes and delivers from *its* network position, so an address that only means
something on the agent's own machine (127.0.0.1, localhost, ::1, 0.0.0.0) is refused
unless the agent opts in explicitly for local development. `refusal` is that rule, asked
by the SDK when an ``Agent`` is built (fail early, on the author's machine) and by the
registry when it registers (the hub does not trust the SDK to have asked).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from reach.errors import InvalidRegistration, LoopbackAddress, RegistryError

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
        value = inet_aton(host)
        if value is None:
            return None
        ip = ipaddress.IPv4Address(value)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


_INET_ATON_LIMITS = (0xFFFFFFFF, 0xFFFFFF, 0xFFFF, 0xFF)  # the last part, by parts before it
_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


def inet_aton(text: str) -> int | None:
    """The IPv4 address C's ``inet_aton`` reads in ``text``, or None if it reads none.

    Resolvers accept these spellings, so ``127.1``, ``0x7f.1`` and ``2130706433`` all reach
    127.0.0.1: 1 to 4 dot-separated parts, each decimal, octal (leading ``0``) or hex
    (``0x``); every part but the last is one byte, the last fills the remaining bytes.
    Unlike glibc this accepts no trailing whitespace: a host name never carries any.
    (Pure, so reach.core needs no ``socket``; tests check it against ``socket.inet_aton``.)
    """
    parts = text.split(".")
    if len(parts) > 4:
        return None
    values = [_inet_aton_part(p) for p in parts]
    address = 0
    for value in values[:-1]:
        if value is None or value > 0xFF:
            return None
        address = address << 8 | value
    last = values[-1]
    if last is None or last > _INET_ATON_LIMITS[len(values) - 1]:
        return None
    return address << 8 * (5 - len(values)) | last


def _inet_aton_part(part: str) -> int | None:
    """One part as ``strtoul(part, 0)`` reads it, if it reads all of it (C's number forms)."""
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
    elif part.startswith("0"):
        digits, base = part, 8
    else:
        digits, base = part, 10
    if not digits or not all(c in _DIGITS[base] for c in digits):
        return None
    value = int(digits, base)
    return value if value <= 0xFFFFFFFF else None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the hub cannot use an agent's address, and which declared field is at fault."""

    kind: type[RegistryError]
    field: str
    message: str

    def error(self) -> RegistryError:
        return self.kind(self.message, field=self.field)


def refusal(addr: Endpoint, public: Endpoint | None, allow_loopback: bool) -> Refusal | None:
    """The loopback rule: None if the hub can reach this instance where it says it is.

    The address that counts is the public endpoint when there is one (an agent may bind
    on loopback behind a routable proxy), else the bind address.
    """
    reachable = public or addr
    field = "public_endpoint" if public is not None else "addr"
    if reachable.is_unspecified:
        return Refusal(
            InvalidRegistration,
            field,
            f"{reachable.host} is not an address the hub can reach; "
            "bind there if you like, but set public_endpoint to the routable address",
        )
    if reachable.is_loopback and not allow_loopback:
        return Refusal(
            LoopbackAddress,
            field,
            f"{reachable.url} is a loopback address: the hub probes and delivers from its own "
            "host, where it points at the hub itself. Register a routable address, set "
            "public_endpoint, or pass allow_loopback=True for local development.",
        )
    return None


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
