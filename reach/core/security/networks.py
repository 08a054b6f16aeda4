"""Which addresses the hub will call: the SSRF rule, without I/O.

Whoever holds an agent key chooses an address the hub probes and POSTs to; whoever holds
a caller key chooses a callback URL. Both are server-side requests from the hub's network
position, so the hub judges the *addresses* a name resolves to (not its spelling: a
hosts-file name or a DNS record may point anywhere) at registration, before every probe
and, through its connector, at every connection a delivery or callback opens (so a name
that changes its answer after the check -- DNS rebinding -- is judged again).

One rule for every kind of call, from ``ipaddress``' own classification:

* link-local addresses (169.254.0.0/16, fe80::/10: where cloud metadata services answer),
  multicast and unspecified addresses are never called;
* loopback only where the rule allows it (a local demo hub, or the operator's
  ``security.allow_loopback_agents``; ``callbacks.allow_private`` for callbacks);
* an address in a network the operator declared (``security.agent_networks``);
* a global address (``is_global``, and neither private nor reserved);
* anything else (private, shared 100.64.0.0/10, reserved) only where the rule allows
  every private address (the demo hub; ``callbacks.allow_private``).

Python before 3.12.4 calls 192.0.0.0/24 (IETF protocol assignments, e.g. 192.0.0.8)
global (gh-113171); that one correction is made here, so the rule does not depend on the
interpreter's patch level.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from reach.core.security.auth import auth_required, is_loopback_host

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

__all__ = [
    "Address",
    "Network",
    "NetworkRule",
    "as_address",
    "is_demo_hub",
    "parse_networks",
]

_IETF_ASSIGNMENTS: Final = ipaddress.IPv4Network("192.0.0.0/24")  # gh-113171
_NEVER: Final = (ipaddress.IPv4Network("169.254.0.0/16"), ipaddress.IPv6Network("fe80::/10"))


def as_address(text: str) -> Address:
    """The address ``text`` names (an IPv6 zone dropped, IPv4-mapped IPv6 unwrapped);
    ValueError if it is not an IP address."""
    ip = ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_public(ip: Address) -> bool:
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return False
    return not (isinstance(ip, ipaddress.IPv4Address) and ip in _IETF_ASSIGNMENTS)


@dataclass(frozen=True, slots=True)
class NetworkRule:
    """Which addresses one kind of call may go to (see the module docstring)."""

    loopback: bool = False  # loopback addresses allowed
    private: bool = False  # every non-global unicast address allowed (not link-local)
    networks: tuple[Network, ...] = ()  # declared networks allowed

    def refusal(self, address: str) -> str | None:
        """Why the hub will not call ``address`` (an IP), or None: the kind of address
        (``"a loopback address"``), never the address itself, so a refusal shown to
        whoever chose a name tells them nothing of where it points."""
        try:
            ip = as_address(address)
        except ValueError:
            return "not an IP address"
        if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
            inner = self.refusal(str(ip.sixtofour))  # 6to4 carries an IPv4 address
            if inner is not None:
                return f"6to4 of {inner}"
        if ip.is_unspecified:
            return "an unspecified address"
        if ip.is_multicast:
            return "a multicast address"
        if ip.is_link_local:
            return "a link-local address (cloud metadata lives there)"
        if ip.is_loopback:
            return None if self.loopback else "a loopback address"
        if any(ip.version == n.version and ip in n for n in self.networks):
            return None
        if _is_public(ip) or self.private:
            return None
        if ip.is_private:
            return "a private address outside the declared networks"
        return "not a public address (reserved or shared)"

    def first_refusal(self, addresses: Iterable[str]) -> str | None:
        """The refusal of the first address refused (one refuses the whole name)."""
        for address in addresses:
            why = self.refusal(address)
            if why is not None:
                return why
        return None


def parse_networks(values: Sequence[str]) -> tuple[Network, ...]:
    """The CIDRs an operator declared; ValueError naming a value that is not one, or one
    the rule never opens (link-local: never; loopback: ``allow_loopback_agents``)."""
    networks: list[Network] = []
    for value in values:
        try:
            network = ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            raise ValueError(f"{value!r} is not a network (CIDR, e.g. 10.0.0.0/8)") from None
        if any(network.version == n.version and network.overlaps(n) for n in _NEVER):
            raise ValueError(f"{value!r} overlaps link-local addresses, which are never called")
        if network.is_loopback:
            raise ValueError(f"{value!r} is loopback: set allow_loopback_agents instead")
        networks.append(network)
    return tuple(networks)


def is_demo_hub(require_auth: bool | None, bind_host: str) -> bool:
    """A local demo: the API listens on loopback only and takes requests without keys
    (``reach up`` as shipped). Whoever may register there sits on the hub's own machine
    and reaches what the hub reaches; it may register loopback and private agents."""
    return is_loopback_host(bind_host) and not auth_required(require_auth, bind_host)
