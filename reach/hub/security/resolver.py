"""The resolver of every aiohttp connection the hub opens to an agent or a callback URL:
each answer judged by the network rule as the connection is made.

A module of its own so that `reach.hub.security.networks`, which registration and the
API import, does not load aiohttp (0.13 s of every `reach api` start, which never opens
such a connection).
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from reach.core.security.networks import NetworkRule
from reach.hub.security.networks import AddressRefusedError


class GuardedResolver(AbstractResolver):
    """aiohttp's threaded resolver, whose every answer is judged by ``rule``: one refused
    address refuses the name (`AddressRefusedError`), and nothing is connected."""

    def __init__(self, rule: NetworkRule) -> None:
        self.rule = rule
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        refusal = self.rule.first_refusal(r["host"] for r in found)
        if refusal is not None:
            raise AddressRefusedError(f"address refused: {refusal}")
        return found

    async def close(self) -> None:
        await self._inner.close()
