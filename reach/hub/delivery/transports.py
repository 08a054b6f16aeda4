"""How the hub talks to an agent instance: one small protocol, one transport per wire.

* `HttpTransport` — the SDK's wire: POST ``{endpoint}/tasks/{method}`` with the delivery
  and its reach token;
* `MtlsTransport` — the same for L1 agents, over mutual TLS only: the hub's client
  certificate, the hub CA as the only trust root, and the agent's identity name asserted
  before any body is sent (a certificate of another agent, or of another CA, fails the
  handshake). An L1 target the hub cannot reach that way (``http://``, no hub
  certificates) is never contacted: its answer is ``refused``, a terminal failure;
* `ChannelTransport` — agents behind NAT: the same POST, to the API replica that holds
  the agent's WebSocket (``reach.hub.interop.channel``), which forwards it as a frame;
* `A2ATransport` — A2A agents: a JSON-RPC ``SendMessage`` (streaming when the card says
  so) under the card's security scheme (``reach.hub.interop.a2a.exchange``);
* `McpTransport` — MCP servers: a ``tools/call`` of the tool the method names, on the
  ``mcp`` client (``reach.hub.interop.mcp.client``), its progress notifications recorded.

`AgentTransport` chooses one per attempt (`AgentTransport.exchange`) and owns what they
share: an aiohttp session per event loop, the body cap, the hub's TLS material.
Measured before choosing (``python -m bench.exchanges``): 2,000 exchanges in flight at
once cost aiohttp 0.4 ms of CPU each, requests on 2,000 threads 1.1 ms, gevent 0.7 ms
and httpx's async client 11 ms. Foreign exceptions stop here: callers get
`AgentAnswer` (``status``, ``body``) or (None, ``error``), which
``reach.core.delivery.retry.classify`` turns into an outcome. Redirects are never followed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import ssl
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import aiohttp

from reach.core.delivery.answers import AgentAnswer
from reach.core.interop import a2a as a2a_rules
from reach.core.interop.channel import INTERNAL_PATH
from reach.core.security.networks import NetworkRule
from reach.core.security.trust import identity_name, mtls_refusal
from reach.hub.delivery.loop import LoopThread
from reach.hub.interop.a2a import PROTOCOL as PROTOCOL_A2A
from reach.hub.interop.a2a.exchange import Peer, envelope_of
from reach.hub.interop.mcp.client import call_tool
from reach.hub.interop.mcp.servers import PROTOCOL as PROTOCOL_MCP
from reach.hub.security.networks import AddressRefusedError, literal_refusal
from reach.hub.security.resolver import GuardedResolver
from reach.hub.settings import Settings
from reach.wire.sse import parse_sse

if TYPE_CHECKING:
    from reach.hub.delivery.routing import Dispatch

T = TypeVar("T")

MAX_ANSWER_BYTES = 1_048_576  # as for payloads: larger results travel by reference
_CHUNK = 65_536

ProgressSink = Callable[[a2a_rules.Progress], Awaitable[None]]
"""Where a streaming exchange's status updates go (recorded as the task's progress)."""


@dataclass(frozen=True, slots=True)
class HubTls:
    """The hub's side of mutual TLS (``security.tls``, defaults under ``<home>/certs``)."""

    ca_cert: Path
    client_cert: Path
    client_key: Path
    ca_cert_set: bool = False  # security.tls.ca_cert was given: https to L2/L3 trusts it too

    @classmethod
    def from_settings(cls, settings: Settings) -> HubTls:
        tls = settings.security.tls
        certs = settings.storage.home_path / "certs"
        return cls(
            Path(tls.ca_cert) if tls.ca_cert else certs / "ca.pem",
            Path(tls.client_cert) if tls.client_cert else certs / "hub.pem",
            Path(tls.client_key) if tls.client_key else certs / "hub.key",
            ca_cert_set=bool(tls.ca_cert),
        )

    def missing(self) -> list[Path]:
        return [p for p in (self.ca_cert, self.client_cert, self.client_key) if not p.is_file()]


@dataclass(frozen=True, slots=True)
class Exchanged:
    """What one exchange brought back: the answer as an SDK agent's envelope, and the A2A
    verdict it came from (A2A instances only). ``unsent``: the hub's own answer for an
    attempt it did not send (no place at the instance in time, its breaker opened, its
    task cancelled), never sent again from the loop."""

    answer: AgentAnswer
    verdict: a2a_rules.Verdict | None = None
    unsent: bool = False


class Transport(Protocol):
    """One wire to agent instances."""

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged: ...


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class AgentHttp:
    """HTTP to agents on aiohttp: a session (connection pool) per event loop and network
    rule, one deadline for the whole exchange, a capped body, no redirects, no proxies
    from the environment.

    ``network``: the addresses agents may be called at (`reach.core.security.networks`), judged
    as each connection is made (`reach.hub.security.resolver.GuardedResolver`); None: any (tools
    and tests; the worker always passes the hub's rule). A POST may name another rule
    (a callback's) or none (the hub's own replicas, for the channel)."""

    def __init__(
        self,
        max_body_bytes: int = MAX_ANSWER_BYTES,
        tls: HubTls | None = None,
        network: NetworkRule | None = None,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.tls = tls
        self.network = network
        self._sessions: dict[
            tuple[asyncio.AbstractEventLoop, NetworkRule | None], aiohttp.ClientSession
        ] = {}
        self._verify: ssl.SSLContext | None = None
        self._mtls: ssl.SSLContext | None = None

    def _session(self, rule: NetworkRule | None) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get((loop, rule))
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # the exchanger bounds what is in flight, not the pool
                ttl_dns_cache=10,
                enable_cleanup_closed=True,
                resolver=GuardedResolver(rule) if rule is not None else None,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
            )
            self._sessions[(loop, rule)] = session
        return session

    def _rule(self, rule: NetworkRule | None, unguarded: bool) -> NetworkRule | None:
        return None if unguarded else rule or self.network

    def verify_context(self) -> ssl.SSLContext | bool:
        """https to L2/L3 agents: the system's roots, or the hub CA if one was given."""
        if self.tls is None or not self.tls.ca_cert_set:
            return True
        if self._verify is None:
            self._verify = ssl.create_default_context(cafile=str(self.tls.ca_cert))
        return self._verify

    def mtls_context(self) -> ssl.SSLContext | str:
        """The L1 client context (hub CA only, hub certificate), or why there is none."""
        tls = self.tls
        missing = tls.missing() if tls is not None else []
        if tls is None or missing:
            named = ", ".join(str(p) for p in missing) or "no hub TLS configured"
            return (
                f"L1 agent requires https + mTLS, and the hub has no certificates for it "
                f"({named}): run `reach certs init` on the hub host, or set security.tls"
            )
        if self._mtls is None:
            context = ssl.create_default_context(cafile=str(tls.ca_cert))
            context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
            self._mtls = context
        return self._mtls

    async def post(
        self,
        url: str,
        body: dict[str, Any] | bytes,
        connect_timeout: float,
        timeout: float,
        headers: dict[str, str] | None = None,
        *,
        ssl_context: ssl.SSLContext | bool | None = None,
        identity: str | None = None,
        rule: NetworkRule | None = None,
        unguarded: bool = False,
    ) -> AgentAnswer:
        """POST one JSON body (or bytes already encoded: a signed body); the whole
        exchange ends by ``connect + timeout`` seconds.

        A per-read timeout would let an agent that trickles a byte a second outlive the
        attempt's lease and be delivered twice: one deadline covers it all. ``identity``:
        the name the server's certificate must carry (mTLS), whatever the URL's host; a
        certificate that fails that check is a ``refused`` answer, nothing sent.
        ``rule``: the network rule of this call (default: agents'); ``unguarded``: none
        (the hub's own replica)."""
        total = connect_timeout + timeout
        guard = self._rule(rule, unguarded)
        if guard is not None and (why := literal_refusal(url, guard)) is not None:
            return AgentAnswer(None, None, f"address refused: {why}")
        try:
            async with asyncio.timeout(total):
                async with self._session(guard).post(
                    url,
                    data=body if isinstance(body, bytes) else json.dumps(body),
                    headers={"Content-Type": "application/json", **(headers or {})},
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
                    allow_redirects=False,
                    ssl=self.verify_context() if ssl_context is None else ssl_context,
                    server_hostname=identity,
                ) as resp:
                    return await self._answer(resp)
        except TimeoutError:
            return AgentAnswer(None, None, f"timed out: no whole answer within {total:.1f}s")
        except (aiohttp.ClientError, OSError) as exc:
            if identity is not None and _verification_failed(exc):
                return AgentAnswer(
                    None,
                    None,
                    f"the agent's certificate is not one the hub CA issued for {identity}: "
                    f"{_described(exc)}",
                    refused=True,
                )
            return AgentAnswer(None, None, _described(exc))

    async def post_mtls(
        self,
        url: str,
        body: dict[str, Any] | bytes,
        connect_timeout: float,
        timeout: float,
        headers: dict[str, str] | None = None,
        *,
        agent_id: str,
    ) -> AgentAnswer:
        """`post` to the L1 agent ``agent_id`` over mutual TLS, its identity asserted; a
        ``refused`` answer, nothing sent, when that cannot be done safely."""
        refusal = mtls_refusal(url)
        context = self.mtls_context() if refusal is None else refusal
        if isinstance(context, str):
            return AgentAnswer(None, None, context, refused=True)
        answer = await self.post(
            url, body, connect_timeout, timeout, headers,
            ssl_context=context, identity=identity_name(agent_id),
        )  # fmt: skip
        if answer.refused:
            message = f"L1 agent {agent_id} failed mTLS verification: {answer.error}"
            return AgentAnswer(None, None, message, refused=True)
        return answer

    async def _answer(self, resp: aiohttp.ClientResponse) -> AgentAnswer:
        declared = resp.content_length
        if declared is not None and declared > self.max_body_bytes:
            return self._too_large(resp.status)
        chunks: list[bytes] = []
        size = 0
        while chunk := await resp.content.read(_CHUNK):
            size += len(chunk)
            if size > self.max_body_bytes:
                resp.close()
                return self._too_large(resp.status)
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            # NaN and Infinity are not JSON: an answer holding one is not taken as one (no
            # store would hold it; a write that fails on it would be retried forever)
            payload: Any = json.loads(raw, parse_constant=_not_json)
        except ValueError:
            payload = raw[:2000].decode("utf-8", "replace")
        return AgentAnswer(resp.status, payload)

    def _too_large(self, status: int) -> AgentAnswer:
        # Not transient: the same agent would send the same answer again.
        return AgentAnswer(
            status, None, f"answer larger than {self.max_body_bytes} bytes (send a reference)"
        )

    async def post_events(
        self,
        url: str,
        body: dict[str, Any],
        connect_timeout: float,
        timeout: float,
        on_event: Callable[[str], Awaitable[bool]],
        headers: dict[str, str] | None = None,
    ) -> AgentAnswer:
        """POST and read the answer as server-sent events, each event's data handed to
        ``on_event`` as it arrives (it returns True to stop reading); one deadline of
        ``connect + timeout`` seconds for the whole stream, as for `post`.

        An answer that is not an event stream is read and returned as `post` would. A
        stream that ends (or breaks, or runs out of time) answers ``AgentAnswer(200,
        None)`` with ``error`` saying why it stopped early, if it did."""
        total = connect_timeout + timeout
        guard = self._rule(None, False)
        if guard is not None and (why := literal_refusal(url, guard)) is not None:
            return AgentAnswer(None, None, f"address refused: {why}")
        try:
            async with asyncio.timeout(total):
                async with self._session(guard).post(
                    url,
                    data=json.dumps(body),
                    headers={
                        "Content-Type": "application/json",
                        "Accept": "text/event-stream",
                        **(headers or {}),
                    },
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
                    allow_redirects=False,
                    ssl=self.verify_context(),
                ) as resp:
                    if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                        return await self._answer(resp)
                    return await self._events(resp, on_event)
        except TimeoutError:
            return AgentAnswer(200, None, f"timed out: the stream outlived {total:.1f}s")
        except aiohttp.ClientError as exc:
            return AgentAnswer(None, None, _described(exc))
        except OSError as exc:
            return AgentAnswer(None, None, _described(exc))

    async def _events(
        self, resp: aiohttp.ClientResponse, on_event: Callable[[str], Awaitable[bool]]
    ) -> AgentAnswer:
        """Complete events (up to a blank line) go to `parse_sse` as they arrive; an event
        still incomplete past the body cap ends the stream."""
        buffer = b""
        try:
            while chunk := await resp.content.readany():
                buffer = (buffer + chunk).replace(b"\r\n", b"\n")
                cut = buffer.rfind(b"\n\n")
                if cut < 0:
                    if len(buffer) > self.max_body_bytes:
                        return AgentAnswer(200, None, f"an event larger than {self.max_body_bytes}")
                    continue
                complete, buffer = buffer[: cut + 2], buffer[cut + 2 :]
                for _kind, data, _id in parse_sse([complete]):
                    if await on_event(data):
                        return AgentAnswer(200, None)
        except aiohttp.ClientError as exc:
            return AgentAnswer(200, None, f"the stream broke: {_described(exc)}")
        return AgentAnswer(200, None)

    async def close_all(self) -> None:
        """Close every session of this loop (its connections with it)."""
        loop = asyncio.get_running_loop()
        for key, session in list(self._sessions.items()):
            if key[0] is loop:
                del self._sessions[key]
                await session.close()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception under it (args, cause, context), each once."""
    seen: set[int] = set()
    found: list[BaseException] = []
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        todo.extend((*item.args, item.__cause__, item.__context__))
    return found


def _described(exc: BaseException) -> str:
    """What an exchange that got no answer is recorded as (the task's error, its events,
    the dead letter): the kind of failure, never the exception's own text. That text names
    the address and port it failed on, and whoever reads task errors could tell which
    ports of a host refuse, reset or keep silent: a port scanner (issue 37). A timeout
    says ``timed out`` (`AgentAnswer.error_kind` reads it)."""
    chain = _chain(exc)

    def has(*kinds: type[BaseException]) -> bool:
        return any(isinstance(e, kinds) for e in chain)

    refused = next((e for e in chain if isinstance(e, AddressRefusedError)), None)
    if refused is not None:  # the network rule: nothing was connected
        return str(refused)
    if has(TimeoutError, aiohttp.ServerTimeoutError):
        return "timed out: the agent did not answer in time"
    if has(aiohttp.ClientConnectorDNSError, socket.gaierror):
        return "unreachable: the agent's host name does not resolve"
    if has(ssl.SSLError, ssl.CertificateError, aiohttp.ClientSSLError):
        # OpenSSL's reason (CERTIFICATE_VERIFY_FAILED ...) names no host; its text may
        reasons = [str(r) for e in chain if isinstance(r := getattr(e, "reason", None), str)]
        return "unreachable: the TLS handshake failed" + (f" ({reasons[0]})" if reasons else "")
    if has(ConnectionRefusedError) or any(
        isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain
    ):
        return "unreachable: connection refused"
    if has(ConnectionResetError, BrokenPipeError, aiohttp.ServerDisconnectedError):
        return "unreachable: the connection was closed before the answer"
    if has(aiohttp.ClientPayloadError):
        return "unreachable: the answer broke off"
    if has(aiohttp.ClientConnectorError, OSError):
        return "unreachable: no connection to the agent"
    return f"unreachable: {type(exc).__name__}"


def _verification_failed(exc: BaseException) -> bool:
    """True if the chain under ``exc`` holds a certificate verification failure (chain or
    identity), as opposed to a connection that merely broke during the handshake."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(
            item,
            ssl.SSLCertVerificationError
            | ssl.CertificateError
            | aiohttp.ClientConnectorCertificateError,
        ):
            return True
        todo.extend((*item.args, item.__cause__, item.__context__))
    return False


class HttpTransport:
    """The SDK's wire: one POST of the delivery, answered with the envelope."""

    def __init__(self, http: AgentHttp) -> None:
        self.http = http

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged:
        answer = await self.http.post(d.url, d.body, d.connect_timeout, d.timeout, d.headers)
        return Exchanged(answer)


class ChannelTransport(HttpTransport):
    """Agents behind NAT: the POST goes to the API replica holding the agent's socket
    (its endpoint names that replica and a per-socket secret), which forwards it as a
    ``deliver`` frame and answers with the agent's ``result`` frame. A replica that lost
    the socket answers 503: transient, and the retry finds the new holder. The wire is
    HTTP's; the secret in the URL is redacted wherever an error quotes it. The replica
    is the hub's own, not an address an agent chose: no network rule applies."""

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged:
        answer = await self.http.post(
            d.url, d.body, d.connect_timeout, d.timeout, d.headers, unguarded=True
        )
        return Exchanged(answer)


class MtlsTransport:
    """L1 agents: mutual TLS with the agent's identity asserted, or not at all."""

    def __init__(self, http: AgentHttp) -> None:
        self.http = http

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged:
        answer = await self.http.post_mtls(
            d.url, d.body, d.connect_timeout, d.timeout, d.headers, agent_id=d.agent_id
        )
        return Exchanged(answer)


class A2ATransport:
    """A2A agents: ``SendMessage`` (``SendStreamingMessage`` when the card says the agent
    streams) with ``A2A-Version: 1.0`` and the card's security scheme; the hub's
    ``task_id`` is the message ID. Each status update of a stream goes to ``progress``."""

    def __init__(self, http: AgentHttp) -> None:
        self.http = http

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged:
        peer = d.peer
        if peer is None:  # deregistered and re-registered as an SDK agent meanwhile
            message = f"instance {d.instance_id} is no longer an A2A instance"
            return Exchanged(
                AgentAnswer(None, None, message), a2a_rules.Verdict("transient", None, None)
            )
        payload = d.payload if isinstance(d.payload, dict) else {"data": d.payload}
        params = a2a_rules.send_params(
            d.task_id, d.method, payload, attempt_seq=d.attempt_seq, session_id=d.session_id
        )
        request_id = f"{d.task_id}#{d.attempt_seq}"
        if not peer.streaming:
            answer = await self.http.post(
                peer.rpc_url,
                a2a_rules.rpc(a2a_rules.METHOD_SEND, params, request_id),
                d.connect_timeout,
                d.timeout,
                headers=peer.headers(),
            )
            verdict = a2a_rules.judge_response(answer.status, answer.body)
            return Exchanged(envelope_of(answer, verdict), verdict)
        return await self._stream(d, peer, params, request_id, progress)

    async def _stream(
        self,
        d: Dispatch,
        peer: Peer,
        params: dict[str, Any],
        request_id: str,
        progress: ProgressSink,
    ) -> Exchanged:
        fold = a2a_rules.StreamFold()

        async def on_event(data: str) -> bool:
            try:
                event = json.loads(data)
            except ValueError:
                return False
            if not isinstance(event, dict):
                return False
            update = fold.feed(event)
            if update is not None:
                await progress(update)
            return fold.final is not None

        answer = await self.http.post_events(
            peer.rpc_url,
            a2a_rules.rpc(a2a_rules.METHOD_STREAM, params, request_id),
            d.connect_timeout,
            d.timeout,
            on_event,
            headers=peer.headers(),
        )
        if answer.status != 200 or answer.body is not None:
            verdict = a2a_rules.judge_response(answer.status, answer.body)  # no stream: error
        else:
            verdict = fold.verdict()
            if verdict.kind == "cut" and answer.error:
                verdict = a2a_rules.Verdict(
                    "cut", None, None, verdict.remote_task_id, message=answer.error
                )
        return Exchanged(envelope_of(answer, verdict), verdict)


class McpTransport:
    """MCP servers: ``tools/call`` of the tool named by the method, the payload as its
    arguments, at the instance's endpoint (the server's MCP URL). The result is the
    envelope an SDK agent would have sent; no answer is transient, retried as for any
    agent. Each progress notification goes to ``progress``. No reach token: an MCP server
    has no key to verify one with (the same as an A2A agent)."""

    def __init__(self, http: AgentHttp) -> None:
        self.http = http

    async def exchange(self, d: Dispatch, progress: ProgressSink) -> Exchanged:
        in_order = asyncio.Lock()  # FIFO: notifications are recorded in the order they came

        async def on_progress(fraction: float | None, message: str) -> None:
            async with in_order:
                await progress(a2a_rules.Progress(message, None, "", fraction))

        arguments = d.payload if isinstance(d.payload, dict) else {"data": d.payload}
        answer = await call_tool(
            d.url, d.method, arguments, self.http.network, d.connect_timeout, d.timeout,
            on_progress, self.http.max_body_bytes,
        )  # fmt: skip
        return Exchanged(answer)


async def _no_progress(update: a2a_rules.Progress) -> None:
    return None


class AgentTransport:
    """Every wire, chosen per attempt, on one loop (``loop``; a private one if none).

    The worker's exchanger awaits `exchange` on its loop; synchronous callers (the A2A
    follow, tests, the single-attempt `deliver_attempt`) `run` a coroutine on it."""

    def __init__(
        self,
        max_body_bytes: int = MAX_ANSWER_BYTES,
        tls: HubTls | None = None,
        loop: LoopThread | None = None,
        network: NetworkRule | None = None,
    ) -> None:
        """``tls``: the hub's certificates, needed to reach L1 agents (None: none can be);
        ``network``: the addresses agents may be called at (None: any; see `AgentHttp`)."""
        self.http = AgentHttp(max_body_bytes, tls, network)
        self.loop = loop or LoopThread("reach-agent-http")
        # its connections are closed on its loop when it goes (or the process exits)
        weakref.finalize(self, _close, self.http, self.loop, loop is None)
        self._http = HttpTransport(self.http)
        self._channel = ChannelTransport(self.http)
        self._mtls = MtlsTransport(self.http)
        self._a2a = A2ATransport(self.http)
        self._mcp = McpTransport(self.http)

    def transport_for(self, d: Dispatch) -> Transport:
        """The instance's wire: A2A or MCP by its protocol, mTLS by its trust level (L1),
        the channel by its endpoint, plain HTTP otherwise."""
        if d.protocol == PROTOCOL_A2A:
            return self._a2a
        if d.protocol == PROTOCOL_MCP:
            return self._mcp
        if d.trust_level == "L1":
            return self._mtls
        if INTERNAL_PATH in d.url:
            return self._channel
        return self._http

    async def exchange(self, d: Dispatch, progress: ProgressSink = _no_progress) -> Exchanged:
        return await self.transport_for(d).exchange(d, progress)

    async def apost(
        self,
        url: str,
        body: dict[str, Any] | bytes,
        connect_timeout: float,
        timeout: float,
        headers: dict[str, str] | None = None,
        mtls_agent: str | None = None,
    ) -> AgentAnswer:
        """One POST outside an attempt; ``mtls_agent``: the target is this L1 agent."""
        if mtls_agent is not None:
            return await self.http.post_mtls(
                url, body, connect_timeout, timeout, headers, agent_id=mtls_agent
            )
        return await self.http.post(url, body, connect_timeout, timeout, headers)

    def post(
        self,
        url: str,
        body: dict[str, Any],
        connect_timeout: float,
        timeout: float,
        headers: dict[str, str] | None = None,
        mtls_agent: str | None = None,
    ) -> AgentAnswer:
        """`apost`, blocking (the A2A follow's ``GetTask``; tools and tests)."""
        return self.run(self.apost(url, body, connect_timeout, timeout, headers, mtls_agent))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this transport's loop and wait for it (from another thread)."""
        return self.loop.run(coro)


def _close(http: AgentHttp, loop: LoopThread, own_loop: bool) -> None:
    """Close ``http``'s sessions on their loop (and the loop, when it was ours)."""
    if loop.running():
        try:
            loop.run(http.close_all(), timeout=5)
        except Exception:  # the loop is going away anyway; nothing to leak into
            pass
        if own_loop:
            loop.stop()
