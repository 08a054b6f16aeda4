"""Several uvicorn listeners in one process (agent-facing and admin ports), one shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI

from reach.hub.api import edge
from reach.hub.api.edge import EdgeLimits
from reach.hub.settings import LoggingSettings


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # signals are handled once for all listeners in serve_together()


# Idle keep-alive connections are kept longer than a client waits between calls (uvicorn's
# default, 5 s, equals the demo agents' heartbeat interval: the server closed the pooled
# connection just as the next heartbeat was sent on it, and that heartbeat was lost to a
# "connection reset by peer"). A client idle for longer finds its socket closed and redials.
KEEP_ALIVE_S = 75


def uvicorn_options(limits: EdgeLimits, log: LoggingSettings | None = None) -> dict[str, Any]:
    """uvicorn's options for the API: its keep-alive, its HTTP protocol with the edge's
    limits (`reach.hub.api.edge`) and its logging (``logging``: with JSON lines uvicorn
    installs no formatter of its own and its loggers write through the root's handler)."""
    options: dict[str, Any] = {
        "log_level": "info",
        "access_log": bool(log and log.access_log),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "http": edge.protocol(limits),
    }
    if log is not None and log.format == "json":
        options["log_config"] = None
    return options


def config(
    app: FastAPI, limits: EdgeLimits, log: LoggingSettings | None = None, **where: Any
) -> uvicorn.Config:
    """`uvicorn_options` as a ``uvicorn.Config``; ``where`` is ``host`` and ``port`` if any."""
    return uvicorn.Config(app, **uvicorn_options(limits, log), **where)


def serve_together(
    apps: Sequence[tuple[FastAPI, str, int]],
    limits: EdgeLimits,
    log: LoggingSettings | None = None,
) -> None:
    servers = [_Server(config(app, limits, log, host=host, port=port)) for app, host, port in apps]

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def stop() -> None:
            for server in servers:
                server.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(main())


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket with ``SO_REUSEPORT``: several API processes bind the same port
    and the kernel spreads new connections across them (Linux; the API's replicas on one
    machine without a proxy). Accepted sockets get ``TCP_NODELAY`` from asyncio's
    transports, as with a plain bind (uvicorn's ``--workers`` is not used: see the design
    brief's trap), which `bench`'s replica row checks by its latency."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("SO_REUSEPORT is not available on this platform")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve_on(
    app: FastAPI, sock: socket.socket, limits: EdgeLimits, log: LoggingSettings | None = None
) -> None:
    """Serve ``app`` on an already bound socket (`reuse_port_socket`)."""
    uvicorn.Server(config(app, limits, log)).run(sockets=[sock])
