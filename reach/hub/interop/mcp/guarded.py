"""httpcore's network backend for the hub's MCP client, every TCP connection judged by the
hub's network rule first: the name is resolved, every address judged, and the first judged
address is the one connected (DNS cannot answer differently between check and connect).

A module of its own so that ``httpcore2`` loads with the first MCP session
(``reach.hub.interop.mcp.client``), not with every hub process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpcore2

from reach.core.security.networks import NetworkRule
from reach.hub.security.networks import AddressRefusedError, judge_host


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend, every TCP connection judged by ``rule`` first."""

    def __init__(self, rule: NetworkRule) -> None:
        self.rule = rule
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses, why = await asyncio.to_thread(judge_host, host, port, self.rule)
        if why is not None:
            raise AddressRefusedError(f"address refused: {why}")
        return await self._inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
