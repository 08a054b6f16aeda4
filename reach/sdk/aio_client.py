"""The hub's HTTP client on asyncio (aiohttp), under ``reach.aio``.

The same edge as ``reach.sdk.hub_client``, on the same functions: what comes back goes to
`hub_client.answer` (the typed error of a refusal, key scrubbed, or `ProtocolError` for a
success without the promised JSON object), what fails to `hub_client.unavailable`
(`HubUnavailable`, key redacted). The API key goes per request, never on a session.

One ``aiohttp.ClientSession`` -- one connection pool -- per event loop, made on first use
in that loop: a session is bound to the loop it was made in and must never be used from
another (a second ``asyncio.run``, another thread's loop). A loop's session closes with
the loop: ``asyncio.run`` (and every runner) closes the loop's async generators on the
way out, and one such generator per loop holds its session (`_Pool`); `aclose` closes
the current loop's session sooner. The pool sets no cap on connections: a long-poll holds
its connection up to 30 s, and a capped pool would queue a send behind other waits
(bound your own concurrency, as with threads and the sync client).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import aiohttp

from reach.sdk.hub_client import (
    answer,
    auth_headers,
    default_hub_url,
    refused,
    resolve_api_key,
    unavailable,
)
from reach.sdk.stream import Resumption, SSEParser, StreamEvent

__all__ = ["AsyncHubClient", "aclose", "loop_session", "open_pools", "stream_path"]

CONNECT_TIMEOUT_S = 3.0

# Foreign exceptions a request may raise: aiohttp's own, and a timeout (aiohttp's are
# TimeoutError subclasses; asyncio's timeouts are TimeoutError too).
_FAILURES = (aiohttp.ClientError, TimeoutError)


class _Pool:
    """One loop's session, and the async generator that closes it with the loop.

    The generator, parked at its ``yield``, is registered with the loop (first-iteration
    hook), so the loop's ``shutdown_asyncgens`` -- which ``asyncio.run`` awaits before
    closing the loop -- resumes it into its ``finally``, where the session closes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            # one pool serves every caller of the loop, whatever its key: nothing is kept
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=True,  # proxy variables, as requests (the sync client) honours them
        )
        self._keeper = self._keep()

    async def start(self) -> None:
        await self._keeper.__anext__()

    async def close(self) -> None:
        await self._keeper.aclose()

    def abandon(self) -> None:
        """Forget a pool whose loop was closed without closing its async generators (a
        bare ``loop.close()``): finish the generator here, without the loop, so that no
        finaliser runs later on the dead loop. The session cannot be closed any more
        (aiohttp warns about it, rightly: its sockets were left open)."""
        closing = self._keeper.aclose()
        try:
            closing.send(None)
        except StopIteration:
            pass

    async def _keep(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with _lock:
                if _pools.get(self.loop) is self:
                    del _pools[self.loop]
            if not self.loop.is_closed():
                await self.session.close()


# A plain dict, not a WeakKeyDictionary: the session refers to its loop, so a weak key
# would never die anyway. Entries leave when the loop shuts down, by `aclose`, or when a
# later call finds their loop closed.
_pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
_lock = threading.Lock()  # loops of several threads share the table


async def loop_session() -> aiohttp.ClientSession:
    """The running loop's pooled session (made and registered on first use)."""
    loop = asyncio.get_running_loop()
    with _lock:
        pool = _pools.get(loop)
        abandoned = [p for other, p in _pools.items() if other.is_closed()]
        for p in abandoned:
            del _pools[p.loop]
        if pool is None:
            pool = _pools[loop] = _Pool(loop)
            fresh = True
        else:
            fresh = False
    for p in abandoned:
        p.abandon()
    if fresh:
        await pool.start()
    return pool.session


async def aclose() -> None:
    """Close the running loop's pool now (its open connections with it); the next call
    in this loop opens a new one. Without it the pool closes when the loop ends."""
    with _lock:  # taken out first: a second aclose meanwhile finds nothing to close
        pool = _pools.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()


def open_pools() -> int:
    """How many loops hold a pool now (for tests and diagnostics)."""
    with _lock:
        return len(_pools)


class AsyncHubClient:
    """Calls to one hub from asyncio, on the running loop's pool (see the module
    docstring); as `reach.sdk.hub_client.HubClient` otherwise, with the same errors.

    ``api_key``: sent with every request; None takes `default_api_key` (inside a handler,
    its agent's key, from the context of the task that builds the client), ``""`` none.
    """

    def __init__(
        self,
        hub: str | None = None,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = 10.0,
        api_key: str | None = None,
    ) -> None:
        self.base_url = (hub or default_hub_url()).rstrip("/")
        self.timeout = aiohttp.ClientTimeout(sock_connect=connect_timeout, sock_read=read_timeout)
        self._api_key = resolve_api_key(api_key)
        self._headers = auth_headers(self._api_key)

    @property
    def authenticated(self) -> bool:
        """Whether this client sends an API key."""
        return self._api_key is not None

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"AsyncHubClient({self.base_url!r}, api_key={key})"

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        keys: tuple[str, ...] = (),
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` (with ``headers`` beside the key's); the answer must be a JSON
        object holding ``keys``."""
        if headers:
            return await self._request("POST", path, keys, json=body, headers=headers)
        return await self._request("POST", path, keys, json=body)

    async def get(
        self, path: str, params: Mapping[str, Any] | None = None, *, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """GET ``path``; the answer must be a JSON object holding ``keys``."""
        return await self._request("GET", path, keys, params=_query(params))

    async def _request(
        self, method: str, path: str, keys: tuple[str, ...], **kwargs: Any
    ) -> dict[str, Any]:
        http = await loop_session()
        extra = kwargs.pop("headers", None)
        try:
            async with http.request(
                method,
                self.base_url + path,
                headers={**self._headers, **extra} if extra else self._headers,
                timeout=self.timeout,
                **kwargs,
            ) as resp:
                status, kind, body = (
                    resp.status,
                    resp.headers.get("Content-Type"),
                    await resp.read(),
                )
        except _FAILURES as exc:
            error, cause = unavailable(
                self.base_url,
                exc,
                timed_out=isinstance(exc, TimeoutError),
                api_key=self._api_key,
            )
            raise error from cause
        return answer(status, kind, body, keys, f"{method} {self.base_url}{path}", self._api_key)


async def fetch(url: str, read_timeout: float) -> tuple[int, bytes]:
    """GET a URL that needs no key (a blob link): its status and body. Foreign errors
    are raised as they come: the caller names the URL as it may be shown."""
    http = await loop_session()
    timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=read_timeout)
    async with http.get(url, timeout=timeout) as resp:
        return resp.status, await resp.read()


FETCH_FAILURES = _FAILURES


def _query(params: Mapping[str, Any] | None) -> list[tuple[str, str]] | None:
    """``params`` as requests encodes them: a list repeats its key, values as ``str``."""
    if params is None:
        return None
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        for one in value if isinstance(value, list | tuple) else [value]:
            pairs.append((key, str(one)))
    return pairs


async def stream_path(
    path: str,
    *,
    hub: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    last_event_id: int | None = None,
) -> AsyncIterator[StreamEvent]:
    """Follow one of the hub's streams (see ``reach.sdk.stream``) on the loop's pool,
    resuming on drops with ``Last-Event-ID``: `Resumption` decides as for the sync one."""
    key = resolve_api_key(api_key)
    state = Resumption((hub or default_hub_url()).rstrip("/"), path, key, timeout, last_event_id)
    while True:
        http = await loop_session()
        read = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=state.read_timeout())
        try:
            async with http.get(state.url, headers=state.headers(), timeout=read) as resp:
                if resp.status >= 400:
                    raise refused(resp.status, await resp.read(), key)
                parser = SSEParser()
                async for chunk in resp.content.iter_any():
                    for kind, data, event_id in parser.feed(chunk):
                        event = state.seen(kind, data, event_id)
                        yield event
                        if event.final:
                            return
        except _FAILURES as exc:
            state.dropped(str(exc) or type(exc).__name__)
        await asyncio.sleep(state.pause())  # dropped (or closed early): resume after the last id
