"""The hub's side of ``reach.core.security.networks``: names resolved, their addresses judged.

`judge_host` is the check made at registration and before each probe (it returns the
addresses it judged, so a probe connects to exactly those); `GuardedResolver`
(`reach.hub.security.resolver`) is the one an aiohttp connector uses, so every
connection a delivery or a callback opens is judged at connection time (a name that
answered a public address at registration and a loopback one now is refused, whatever
was checked before). An IP literal never reaches a resolver: `literal_refusal` judges it
before the request.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from reach.core.security.networks import NetworkRule, as_address

Resolve = Callable[[str, int], Sequence[str]]
"""``(host, port)`` → the addresses the host resolves to (``socket.getaddrinfo``'s)."""


class AddressRefusedError(OSError):
    """A connection the network rule forbids: never opened."""


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to for a TCP connection (OSError if none)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_literal(host: str) -> bool:
    try:
        as_address(host)
    except ValueError:
        return False
    return True


def judge_host(
    host: str, port: int, rule: NetworkRule, resolver: Resolve = resolve
) -> tuple[list[str], str | None]:
    """The addresses ``host`` stands for and the rule's refusal of them (None: all may be
    called). A name that does not resolve raises ``OSError``."""
    addresses = [host.strip("[]")] if is_literal(host) else list(resolver(host, port))
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    return addresses, rule.first_refusal(addresses)


def literal_refusal(url: str, rule: NetworkRule) -> str | None:
    """The rule's refusal of ``url``'s host when it is an IP literal (a name is judged by
    ``GuardedResolver`` as the connection is made)."""
    host = urlsplit(url).hostname or ""
    return rule.refusal(host) if is_literal(host) else None
