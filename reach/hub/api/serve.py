"""Several uvicorn listeners in one process (agent-facing and admin ports), one shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Generator, Sequence

import uvicorn
from fastapi import FastAPI


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # signals are handled once for all listeners in serve_together()


# Idle keep-alive connections are kept longer than a client waits between calls (uvicorn's
# default, 5 s, equals the demo agents' heartbeat interval: the server closed the pooled
# connection just as the next heartbeat was sent on it, and that heartbeat was lost to a
# "connection reset by peer"). A client idle for longer finds its socket closed and redials.
KEEP_ALIVE_S = 75


def serve_together(apps: Sequence[tuple[FastAPI, str, int]]) -> None:
    servers = [
        _Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level="info",
                access_log=False,
                timeout_keep_alive=KEEP_ALIVE_S,
            )
        )
        for app, host, port in apps
    ]

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def stop() -> None:
            for server in servers:
                server.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(main())
