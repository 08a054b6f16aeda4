"""An agent as an ASGI 3 app, for authors whose service already runs under uvicorn.

    app = agent.asgi_app()                      # uvicorn module:app
    api = FastAPI(lifespan=app.lifespan)        # or inside an existing FastAPI service:
    api.mount("/reach", app)                    # with addr="http://host:port/reach"

It answers exactly what ``agent.serve()`` answers (both route through
``reach.sdk.dispatch`` and ``reach.sdk.running``). Written against the bare ASGI
interface, so the SDK needs no Starlette or FastAPI (a contract in CI).

An ``async def`` handler runs as a task on the server's own event loop (never in a
thread); a plain ``def`` one on the agent's handler threads, never on the loop. A delivery
waits for its handler at most ``accept_after`` seconds, then is answered 202 while the
handler goes on and reports later, as under ``serve()``. Stopping the server cancels
async handlers still running: each is reported as a transient failure the hub retries.

What may block before a handler starts (the reach token check, which may fetch the hub's
keys; a dedup file; a copy of a running task waiting for its answer) runs on a pool of
this app's own. It is larger than ``max_concurrency`` on purpose: a delivery beyond the
limit must get through to be answered 429 at once, not wait in a queue (the default
executor, sized by CPU count, would queue it invisibly).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from reach.core.fleet.endpoints import parse_endpoint
from reach.sdk.dispatch import MAX_REQUEST_BYTES, TOO_LARGE, Reply, TaskCall, dispatch

if TYPE_CHECKING:
    from reach.sdk.agent import Agent

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Threads beyond max_concurrency for answers that take no slot: 429 refusals, and duplicate
# deliveries waiting for the first copy's answer. Threads start only when needed.
_SPARE_THREADS = 32


class AgentApp:
    """ASGI 3 application serving one `Agent`; ``lifespan`` joins and leaves the hub."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        # Without a root_path from the server, serve under the path the hub was given.
        self._declared_root = parse_endpoint(agent.declaration.addr).path
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan_protocol(receive, send)
        else:
            raise RuntimeError(f"reach agent app does not serve {scope['type']!r} connections")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Register and heartbeat while the server runs; deregister when it stops.

        Usable as ``FastAPI(lifespan=agent_app.lifespan)``: a mounted app gets no lifespan
        events of its own, so its parent runs this one.
        """
        await asyncio.to_thread(self.agent._join_hub)
        try:
            yield
        finally:
            self.agent.runner.close()
            await asyncio.to_thread(self.agent._leave_hub)
            self._release_pool()

    def _release_pool(self) -> None:
        """Let this app's threads go (a later request starts a new pool)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    async def _lifespan_protocol(self, receive: Receive, send: Send) -> None:
        async with contextlib.AsyncExitStack() as stack:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        await stack.enter_async_context(self.lifespan())
                    except Exception as exc:
                        await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    try:
                        await stack.aclose()
                    except Exception as exc:
                        await send({"type": "lifespan.shutdown.failed", "message": repr(exc)})
                        return
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = _header(scope, b"content-length")
        authorization = _header(scope, b"authorization")
        root = scope.get("root_path") or self._declared_root
        routed = dispatch(self.agent, scope["method"], scope["path"], length, root, authorization)
        if isinstance(routed, TaskCall):
            try:
                raw = await _read_body(receive)
            except _Disconnected:
                return  # the hub gave up on this attempt; it retries or has moved on
            if raw is None:
                routed = TOO_LARGE
            else:
                routed = await routed.run_async(raw, self._executor())
        await _reply(send, routed)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.agent.declaration.max_concurrency + _SPARE_THREADS,
                    thread_name_prefix=f"reach-asgi-{self.agent.agent_id}",
                )
            return self._pool


class _Disconnected(Exception):
    """The client went away before its request body was in."""


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, None when it outgrows the limit (whatever Content-Length said)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _reply(send: Send, reply: Reply) -> None:
    data = reply.encode()
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
