"""The hub as an MCP client, on the ``mcp`` package's own client over Streamable HTTP:
``initialize`` then ``tools/list`` (registration and the beat's re-read), ``ping`` (probes)
and ``tools/call`` (delivery, on the exchanger's event loop: no worker slot waits on it).

Every connection is judged by the hub's network rule as it is made (`GuardedBackend`: the
name is resolved, every address judged, and the first judged address is the one
connected, so DNS cannot answer differently between the check and the connection), as
aiohttp's `GuardedResolver` does for the other wires. Redirects are the ``mcp`` client's:
same origin only. Foreign exceptions stop here: callers get an `AgentAnswer` or
`McpServerUnavailable`, described by kind, never by the exception's text (it names
addresses and ports: issue 37).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reach.core.delivery.answers import AgentAnswer
from reach.core.interop.mcp import servers as rules
from reach.core.security.networks import NetworkRule
from reach.errors import McpServerUnavailable
from reach.hub.security.networks import AddressRefusedError

if TYPE_CHECKING:
    import httpx2
    from mcp.client.session import ClientSession

# ``mcp`` and its HTTP stack (``httpx2``) are imported by the functions that speak it, on
# first use: they cost every hub process ~0.5 s and ~18 MB at start-up, and most hubs never
# reach an MCP server.

ProgressFn = Callable[[float | None, str], Awaitable[None]]
"""Where a call's progress notifications go: the fraction done (None: no total), the text."""

MAX_RESULT_BYTES = 1_048_576  # as for an SDK agent's answer: larger results travel by reference
MAX_TOOLS = 256  # a registration declares at most this many capabilities
_MAX_PAGES = 16


def _client(rule: NetworkRule | None, connect_timeout: float, timeout: float) -> httpx2.AsyncClient:
    """An HTTP client for one MCP session: no proxies from the environment, the MCP
    client's redirect rule, connections judged by ``rule`` (None: any address)."""
    import httpcore2
    import httpx2

    from reach.hub.interop.mcp.guarded import GuardedBackend

    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    if rule is not None:
        # the pool is the transport's own, built again with the guarded backend: the
        # transport keeps mapping httpx's requests and errors onto it
        transport._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(), network_backend=GuardedBackend(rule)
        )
    return httpx2.AsyncClient(
        transport=transport,
        trust_env=False,
        timeout=httpx2.Timeout(connect_timeout, read=timeout + connect_timeout),
    )


@asynccontextmanager
async def _session(
    url: str,
    rule: NetworkRule | None,
    connect_timeout: float,
    timeout: float,
    max_bytes: int = MAX_RESULT_BYTES,
) -> AsyncIterator[tuple[ClientSession, str]]:
    """An initialized MCP session with the server at ``url`` and the server's name. An
    event of its stream four times past ``max_bytes`` breaks it (memory stays bounded);
    a result past ``max_bytes`` but within that is read, then refused by `call_tool`."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        _client(rule, connect_timeout, timeout) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=4 * max_bytes) as (
            read,
            write,
        ),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        yield session, init.server_info.name


def described(exc: BaseException) -> str:
    """Why an MCP exchange got no answer, by kind (``timed out`` for a timeout, which
    `AgentAnswer.error_kind` reads): never the exception's text, but for the network rule's
    own refusal."""
    import httpx2

    chain = _chain(exc)

    def has(*kinds: type[BaseException]) -> bool:
        return any(isinstance(e, kinds) for e in chain)

    refused = next((e for e in chain if isinstance(e, AddressRefusedError)), None)
    if refused is not None:
        return str(refused)
    if has(TimeoutError, httpx2.TimeoutException):
        return "timed out: the MCP server did not answer in time"
    if has(ConnectionRefusedError, httpx2.ConnectError):
        return "unreachable: no connection to the MCP server"
    if has(httpx2.RemoteProtocolError, httpx2.ReadError, ConnectionResetError):
        return "unreachable: the connection was closed before the answer"
    if has(httpx2.HTTPStatusError):
        status = next(e for e in chain if isinstance(e, httpx2.HTTPStatusError)).response
        return f"unreachable: the MCP server answered HTTP {status.status_code}"
    mcp_error = _mcp_error(chain)
    if mcp_error is not None:
        return f"unreachable: the MCP session failed ({mcp_error.code})"
    return f"unreachable: {type(exc).__name__}"


def _mcp_error(chain: list[BaseException]) -> Any:
    """The chain's MCP session error, if it holds one (an ``mcp.shared.exceptions.MCPError``)."""
    from mcp.shared.exceptions import MCPError

    return next((e for e in chain if isinstance(e, MCPError)), None)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what is under it: exception groups' members, causes, contexts."""
    seen: set[int] = set()
    found: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, BaseExceptionGroup):
            todo.extend(item.exceptions)
        todo.extend((item.__cause__, item.__context__))
    return found


@dataclass(frozen=True, slots=True)
class Listing:
    """What the server said of itself: its name and its tools (as JSON, by the wire's names)."""

    name: str
    tools: list[dict[str, Any]]


async def list_tools(url: str, rule: NetworkRule | None, timeout: float) -> Listing:
    """``initialize`` and every page of ``tools/list``; `McpServerUnavailable` if the
    server does not answer them within ``timeout`` seconds."""
    from mcp_types import PaginatedRequestParams

    try:
        async with asyncio.timeout(timeout):
            async with _session(url, rule, timeout, timeout) as (session, name):
                tools: list[dict[str, Any]] = []
                cursor: str | None = None
                for _ in range(_MAX_PAGES):
                    page = await session.list_tools(
                        params=None if cursor is None else PaginatedRequestParams(cursor=cursor)
                    )
                    tools += [
                        t.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for t in page.tools
                    ]
                    cursor = page.next_cursor
                    if not cursor or len(tools) >= MAX_TOOLS:
                        break
                return Listing(name, tools[:MAX_TOOLS])
    except Exception as exc:
        raise McpServerUnavailable(
            f"the MCP server at {url} did not list its tools: {described(exc)}", url=url
        ) from None


async def ping(
    url: str, rule: NetworkRule | None, timeout: float, handshake: float
) -> tuple[float | None, str | None]:
    """``initialize`` (within ``handshake`` seconds: several exchanges, a new connection)
    then ``ping`` (within ``timeout``): the ping's round trip in milliseconds, or None and
    why there was none. Only the ping is the measurement."""
    try:
        async with asyncio.timeout(handshake + timeout):
            async with _session(url, rule, handshake, handshake) as (session, _name):
                started = time.perf_counter()
                async with asyncio.timeout(timeout):
                    await session.send_ping()
                rtt_ms = (time.perf_counter() - started) * 1000
        return rtt_ms, None
    except Exception as exc:
        return None, described(exc)


async def call_tool(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    rule: NetworkRule | None,
    connect_timeout: float,
    timeout: float,
    report: ProgressFn,
    max_bytes: int = MAX_RESULT_BYTES,
) -> AgentAnswer:
    """One ``tools/call``, its result as an SDK agent's envelope (``AgentAnswer(200,
        ...)``); no answer at all (refused, reset, timed out, the session broke) is
        ``AgentAnswer(None, None, why)``: transient, retried as for any agent. Each progress
    notification goes to ``report``. One deadline of
        ``connect + timeout`` seconds covers the session and the call."""
    total = connect_timeout + timeout

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        await report(rules.progress_fraction(progress, total), message or "")

    try:
        async with asyncio.timeout(total):
            async with _session(url, rule, connect_timeout, timeout, max_bytes) as (
                session,
                _name,
            ):
                result = await session.call_tool(tool, arguments, progress_callback=on_progress)
        body = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        if len(json.dumps(body)) > max_bytes:
            too_large = f"answer larger than {max_bytes} bytes (send a reference)"
            return AgentAnswer(200, None, too_large)
        return AgentAnswer(200, rules.envelope_of(body))
    except TimeoutError:
        return AgentAnswer(None, None, f"timed out: no whole answer within {total:.1f}s")
    except Exception as exc:
        refused = _mcp_error(_chain(exc))
        if refused is not None and not _transport_failed(exc):
            envelope = rules.rpc_error_envelope(refused.code, refused.message)
            if envelope is not None:
                return AgentAnswer(200, envelope)
        return AgentAnswer(None, None, described(exc))


def _transport_failed(exc: BaseException) -> bool:
    """True if the chain holds a network failure: the JSON-RPC error it also holds is the
    client's own report of a broken connection, not the server's answer."""
    import httpx2

    return any(isinstance(e, httpx2.TransportError | OSError) for e in _chain(exc))
