"""The agent SDK: register with the hub, heartbeat in the background, serve handlers over HTTP.

    agent = reach.Agent("doc-analyzer-01", tags=["doc"], addr="10.0.0.5:7001", hub="http://hub:8800")

    @agent.route("task.process")
    def handle(task_id: str, payload: dict) -> dict: ...

    @agent.route("task.think")
    async def think(task_id: str, payload: dict) -> dict: ...   # async def works too

    agent.serve()                       # the built-in server, or:
    app = agent.asgi_app()              # an ASGI app for uvicorn, or to mount in FastAPI

``asgi_app()`` serves the same routes as ``serve()`` (see ``reach.sdk.asgi``): run it with
``uvicorn module:app``, or ``fastapi_app.mount("/reach", app)`` with
``FastAPI(lifespan=app.lifespan)`` and ``addr="http://host:port/reach"`` so the hub's
deliveries find the mount. An L1 (mutual TLS) agent passes ``tls=reach.TLSConfig(...)``
and an ``https://`` addr; ``reach.sdk.tls`` says how to run the ASGI app under uvicorn
with the same certificates.

The heartbeat runs in its own thread with its own HTTP session, so a handler that hogs
its worker cannot stop the hub from hearing that the process is alive — and the load
fields it reports (in_flight rising while heartbeats stay fresh) are how the hub tells
"alive" from "able to take work". Handlers (``def`` on threads, ``async def`` on an event
loop) run at most ``max_concurrency`` at once; a request beyond it is answered 429 at once
(backpressure), never queued invisibly.

Handlers may think for minutes: a delivery is answered 202 once its handler has run
``accept_after`` seconds (10 by default), and the SDK keeps the hub's watchdog off with
keepalives and reports the outcome when the handler ends (``reach.sdk.running``), so an
author writes a plain function, sync or async, and returns its value.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from cachetools import LRUCache
from pydantic import ValidationError

from reach.core.fleet.endpoints import parse_endpoint, refusal
from reach.core.fleet.names import name_refusal
from reach.core.gates.sessions import CLOSED_SESSIONS_HEADER, parse_closed
from reach.errors import (
    HubUnavailable,
    InvalidRegistration,
    ReachError,
    SecurityError,
    StaleReport,
    UnknownInstance,
)
from reach.sdk import sessions as liveness
from reach.sdk import telemetry
from reach.sdk.caller import progress_call, result_call
from reach.sdk.dedup import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_S,
    IdempotencyGuard,
    SqliteIdempotencyGuard,
)
from reach.sdk.dispatch import Reply, TaskCall, dispatch
from reach.sdk.hub_client import API_KEY_ENV, HubClient, resolve_api_key
from reach.sdk.running import ACCEPTED as ACCEPTED  # where it was first defined
from reach.sdk.running import (
    DEFAULT_ACCEPT_AFTER_S,
    Answer,
    Delivery,
    Handler,
    Run,
    Runner,
    accepted,
)
from reach.sdk.shared_dedup import SharedIdempotencyGuard, is_shared_url
from reach.sdk.tls import LISTEN_BACKLOG, TLSConfig, TLSHTTPServer
from reach.sdk.tokens import TokenVerifier
from reach.wire.schemas import Capability, DeregisterRequest, HeartbeatRequest, RegisterRequest

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from reach.sdk.asgi import AgentApp
    from reach.sdk.channel import AgentChannel

log = logging.getLogger("reach.sdk.agent")

CHANNEL_ADDR = "http://127.0.0.1:9"  # a channel agent's placeholder addr: the hub sets its own

REMEMBERED_ATTEMPTS = 10_000
"""Tasks whose latest delivery an agent remembers, to name it in a later report."""


class Agent:
    """One instance of an agent: its declaration, its heartbeat and its HTTP server."""

    def __init__(
        self,
        agent_id: str,
        tags: Sequence[str] = (),
        addr: str | None = None,
        capabilities: Sequence[Capability | Mapping[str, Any]] = (),
        max_concurrency: int = 8,
        heartbeat_interval: float = 10.0,
        hub: str | None = None,
        allow_loopback: bool = False,
        public_endpoint: str | None = None,
        *,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        version: str = "",
        instance_id: str | None = None,
        dedup_max_bytes: int = DEFAULT_MAX_BYTES,
        dedup_ttl: float = DEFAULT_TTL_S,
        dedup_store: str | os.PathLike[str] | None = None,
        dedup: IdempotencyGuard | None = None,
        api_key: str | None = None,
        tls: TLSConfig | None = None,
        verify_tokens: bool = True,
        max_queue: int | None = None,
        channel: bool | None = None,
        accept_after: float | None = DEFAULT_ACCEPT_AFTER_S,
    ) -> None:
        """``dedup_store``: a SQLite file that keeps answers across restarts (one process
        per file), instead of memory; or a ``redis://`` or ``postgresql://`` URL that every
        replica of this agent names, so a retry the hub moves to another replica never
        runs a task's side effect twice (`reach.sdk.shared_dedup`); ``dedup``: a guard of
        your own (bounds included).

        ``api_key`` (default ``$REACH_API_KEY``): this agent's credential, for registration,
        heartbeats and reports, and the default key of reaches sent from its handlers.

        ``verify_tokens``: check the hub-signed reach token of every delivery and answer
        401 without running a handler when it is missing, forged, expired, replayed or
        for someone else (``reach.sdk.tokens``); turn it off only for an agent that is
        not reached through a hub.

        ``max_queue``: at most this many of this agent's tasks pending or in flight at the
        hub; past it, senders get ``Backpressure`` (429) instead of a growing queue.
        Unset: the hub's ``router.max_queue``; an admin's override wins over both.

        ``accept_after``: seconds a delivery waits for its handler (or half the time left
        before the delivery's deadline, if sooner) before it is answered 202; the handler
        goes on, keepalives hold the hub's watchdog off, and its outcome is reported when
        it ends (``reach.sdk.running``). None: always answer when the handler ends."""
        # ``channel``: take deliveries over a WebSocket this agent opens to the hub
        # (``reach.sdk.channel``), for an agent the hub cannot dial; the default when no
        # ``addr`` is given. ``addr`` is then not served (the hub registers the channel).
        if channel is None:
            channel = not addr
        if not addr and not channel:
            raise InvalidRegistration("addr is required: the host:port the agent binds to")
        self.channel = channel
        if channel:
            addr, public_endpoint, allow_loopback = CHANNEL_ADDR, None, True
        assert addr is not None
        try:
            self.declaration = RegisterRequest(
                agent_id=agent_id,
                instance_id=instance_id or uuid.uuid4().hex,
                addr=addr,
                public_endpoint=public_endpoint,
                tags=list(tags),
                # Mappings are validated by RegisterRequest so errors say which capability.
                capabilities=[c if isinstance(c, Capability) else dict(c) for c in capabilities],
                metadata=dict(metadata or {}),
                max_concurrency=max_concurrency,
                max_queue=max_queue,
                heartbeat_interval=heartbeat_interval,
                allow_loopback=allow_loopback,
                version=version,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "agent"
            errors = [
                {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
                for e in exc.errors()
            ]
            raise InvalidRegistration(f"{where}: {first['msg']}", errors=errors) from None
        refused = refusal(
            parse_endpoint(addr),
            parse_endpoint(public_endpoint) if public_endpoint else None,
            allow_loopback,
        )
        if refused is not None:  # fail here, on the author's machine, not at registration
            raise refused.error()
        self.tls = _checked_tls(tls, addr, public_endpoint)
        # Resolved once, from the environment only (not from a handler this runs inside).
        self._api_key = resolve_api_key(
            api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        )
        self._use_hub(hub, verify_tokens)
        self._routes: dict[str, Handler] = {}
        # Answers kept for redeliveries: bounded in total bytes and in age, not only count.
        if dedup is not None and dedup_store is not None:
            raise ValueError("pass dedup or dedup_store, not both")
        if dedup is None and is_shared_url(dedup_store):
            dedup = SharedIdempotencyGuard(str(dedup_store), ttl=dedup_ttl)
        if dedup is None:
            dedup = (
                SqliteIdempotencyGuard(dedup_store, max_bytes=dedup_max_bytes, ttl=dedup_ttl)
                if dedup_store is not None
                else IdempotencyGuard(max_bytes=dedup_max_bytes, ttl=dedup_ttl)
            )
        self.dedup = dedup
        self._lock = threading.Lock()
        # task_id -> attempt_seq of the latest delivery this instance answered (bounded)
        self._attempts: LRUCache[str, int] = LRUCache(maxsize=REMEMBERED_ATTEMPTS)
        self.runner = Runner(self, max_concurrency, accept_after)
        self._registered = False
        # A register the hub may have committed though its answer never came (a timeout):
        # the instance is deregistered on the way out all the same.
        self._register_sent = False
        self._stop = threading.Event()  # heartbeats stop
        # Joining and leaving the hub take turns: the heartbeat thread re-registers only
        # under this lock and only while the agent is not leaving, and deregister takes
        # it too, so no re-registration starts once `close` has begun to leave.
        self._membership = threading.Lock()
        self._leaving = False
        self._shutdown = threading.Event()  # `serve` returns
        self._heartbeat_thread: threading.Thread | None = None
        self._server: ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None
        self._channel: AgentChannel | None = None

    def _use_hub(self, hub: str | None, verify_tokens: bool) -> None:
        """Talk to ``hub`` (None: the default hub): the clients of heartbeats, of reports,
        and of the hub's keys that check reach tokens (unless ``verify_tokens`` is off).
        ``reach.testing`` calls it again to point an agent at its stand-in hub."""
        self.hub = HubClient(hub, api_key=self._api_key or "")
        # reports and keepalives go on the process's pooled session, apart from heartbeats
        self._reports = HubClient(self.hub.base_url, shared=True, api_key=self._api_key or "")
        # the hub's public keys are open: fetched on the pooled session, without the key
        self.tokens = (
            TokenVerifier(HubClient(self.hub.base_url, shared=True, api_key=""), self.agent_id)
            if verify_tokens
            else None
        )

    # -- identity -----------------------------------------------------------------------
    @property
    def agent_id(self) -> str:
        return self.declaration.agent_id

    @property
    def instance_id(self) -> str:
        assert self.declaration.instance_id is not None
        return self.declaration.instance_id

    @property
    def in_flight(self) -> int:
        return self.runner.in_flight

    def accepted_attempt(self, task_id: str) -> int | None:
        """The ``attempt_seq`` of the latest delivery of ``task_id`` this instance got
        (what a report of its result must name), or None if it got none or forgot it."""
        with self._lock:
            return self._attempts.get(task_id)

    def _remember_attempt(self, task_id: str, body: Mapping[str, Any]) -> None:
        seq = body.get("attempt_seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            with self._lock:  # the newest attempt is the one the hub waits on
                self._attempts[task_id] = max(seq, self._attempts.get(task_id, seq))

    # -- handlers -----------------------------------------------------------------------
    def route(self, method: str) -> Callable[[Handler], Handler]:
        """Register ``fn(task_id, payload)`` as the handler of ``method``: a plain function
        (run on a thread) or an ``async def`` (run on an event loop). Its value must be
        JSON; see ``reach.sdk.running`` for what a long one is answered."""

        why = name_refusal(method)
        if why is not None:  # the hub would never deliver to it: say so now
            raise ValueError(why)

        def decorator(fn: Handler) -> Handler:
            if method in self._routes:
                raise ValueError(f"method {method!r} already has a handler")
            self._routes[method] = fn
            return fn

        return decorator

    # -- hub conversation ---------------------------------------------------------------
    def register(self) -> dict[str, Any]:
        """Register this instance with the hub (idempotent: safe to call again)."""
        self._register_sent = True
        answer = self.hub.post("/v1/agents/register", self.declaration.model_dump(mode="json"))
        self._registered = True
        log.info("registered %s/%s at %s", self.agent_id, self.instance_id, answer.get("endpoint"))
        return answer

    def heartbeat(self) -> dict[str, Any]:
        """Send one heartbeat now; (re-)register if the hub does not know this instance."""
        if not self._registered:
            return self._rejoin()
        body = HeartbeatRequest(
            agent_id=self.agent_id,
            instance_id=self.instance_id,
            **self.runner.load(),
            sent_at=time.time(),
        )
        try:
            answer, headers = self.hub.post_with_headers(
                "/v1/agents/heartbeat", body.model_dump(mode="json")
            )
            liveness.note_closed(parse_closed(headers.get(CLOSED_SESSIONS_HEADER)))
            return answer
        except UnknownInstance:
            log.warning("hub forgot %s/%s; registering again", self.agent_id, self.instance_id)
            return self._rejoin()

    def _rejoin(self) -> dict[str, Any]:
        """Register again, unless the agent is leaving the hub (``close``): a heartbeat
        the hub answered late must not bring a closed instance back."""
        with self._membership:
            if self._leaving:
                log.info("not registering %s/%s again: closing", self.agent_id, self.instance_id)
                return {}
            return self.register()

    def start_heartbeat(self) -> None:
        """Heartbeat every ``heartbeat_interval`` seconds from a daemon thread."""
        if self._heartbeat_thread is not None and self._heartbeat_thread.is_alive():
            return
        self._stop.clear()
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"reach-heartbeat-{self.agent_id}", daemon=True
        )
        self._heartbeat_thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=self.hub.timeout[0] + self.hub.timeout[1] + 1)
            self._heartbeat_thread = None

    def deregister(self) -> None:
        with self._membership:  # after any re-registration under way (see ``_rejoin``)
            if not (self._registered or self._register_sent):
                return
            body = DeregisterRequest(agent_id=self.agent_id, instance_id=self.instance_id)
            try:
                self.hub.post("/v1/agents/deregister", body.model_dump(mode="json"))
            except UnknownInstance:
                pass
            self._registered = self._register_sent = False

    def _heartbeat_loop(self) -> None:
        interval = self.declaration.heartbeat_interval
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
            except HubUnavailable as exc:
                log.warning("heartbeat failed, hub unavailable: %s", exc)
            except SecurityError as exc:  # the hub's detail names the key id at most
                log.error(
                    "heartbeat of %s refused (%s): check this agent's API key: %s",
                    self.agent_id,
                    type(exc).__name__,
                    exc,
                )
            except ReachError as exc:
                log.error("heartbeat refused by hub: %s", exc)
            except Exception:
                log.exception("heartbeat failed unexpectedly")

    # -- serving --------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the HTTP server, register and start heartbeats; returns at once.

        A hub that is down is waited for (heartbeats register later); a hub that refuses
        this agent's key raises ``Unauthenticated`` or ``Forbidden`` here, server closed.
        The ``OTEL_*`` variables turning tracing on, the process exports its handler spans
        (``reach.sdk.telemetry``)."""
        telemetry.configure(self.agent_id)
        if self.channel:
            from reach.sdk.channel import AgentChannel

            self._channel = AgentChannel(self, self.hub.base_url, self._api_key)
            self._channel.start()  # registers through the channel; heartbeats ride on it
            return
        bind = parse_endpoint(self.declaration.addr)
        handler = _make_request_handler(self)
        server = (
            TLSHTTPServer((bind.host, bind.port), handler, self.tls)
            if self.tls is not None
            else _AgentHTTPServer((bind.host, bind.port), handler)
        )
        server.daemon_threads = True
        self._server = server
        self._server_thread = threading.Thread(
            target=server.serve_forever, name=f"reach-http-{self.agent_id}", daemon=True
        )
        self._server_thread.start()
        try:
            self._join_hub()
        except BaseException:
            self._close_server()
            raise

    def asgi_app(self) -> AgentApp:
        """This agent's routes as an ASGI 3 app (for uvicorn, or to mount in FastAPI).

        Its lifespan registers and heartbeats on startup and deregisters on shutdown;
        when mounted, pass ``app.lifespan`` to the parent (mounts get no lifespan events).
        """
        from reach.sdk.asgi import AgentApp

        return AgentApp(self)

    def _join_hub(self) -> None:
        """Register (unless already) and start heartbeats: the server is up elsewhere."""
        telemetry.configure(self.agent_id)  # a mounted agent traces as a served one does
        self._leaving = False
        try:
            if not self._registered:
                self.register()
        except HubUnavailable as exc:
            # The hub may start after its agents; the heartbeat loop keeps trying.
            log.warning("hub unavailable, will register when it answers: %s", exc)
        self.start_heartbeat()

    def _leave_hub(self) -> None:
        """Stop heartbeating and deregister (the hub being down is not an error here)."""
        self._leaving = True
        self.stop_heartbeat()
        try:
            self.deregister()
        except HubUnavailable as exc:
            log.warning("could not deregister (hub unavailable): %s", exc)
        self.hub.close()

    def serve(self) -> None:
        """Serve until SIGINT/SIGTERM (or ``close()``), then deregister cleanly.

        The handlers are in place before registering: the hub lists the instance as soon
        as it commits the registration, so a supervisor may stop it before ``register``
        has returned, and the default SIGTERM would end the process still registered."""
        self._shutdown.clear()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._shutdown.set())
        try:
            self.start()
            self._shutdown.wait()
        finally:
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def close(self) -> None:
        """Stop serving and heartbeating, then deregister this instance."""
        self._leaving = True
        self._shutdown.set()
        self.stop_heartbeat()
        self._close_server()
        self.runner.close()
        self._leave_hub()
        telemetry.flush()
        if isinstance(self.dedup, SharedIdempotencyGuard):  # its lease thread and connection
            self.dedup.close()

    def _close_server(self) -> None:
        if self._channel is not None:
            self._channel.stop()
            self._channel = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- execution ------------------------------------------------------------------------
    def admit(
        self, body: Mapping[str, Any], authorization: str | None, *, method: str, raw: bytes
    ) -> tuple[int, dict[str, Any]] | None:
        """Check a delivery's reach token (``Authorization`` header) before `invoke`: None
        to go on, else the answer to give instead (401, or 503 when it cannot be checked
        yet). ``raw`` is the body's bytes as received (``body`` parsed from them) and
        ``method`` the one it was posted to: the token binds both. Nothing of the
        delivery is remembered when it is refused."""
        if self.tokens is None:
            return None
        refusal = self.tokens.check(authorization, body, method=method, raw=raw)
        if refusal is None:
            return None
        log.warning(
            "refused a delivery of task %r to %s: %s (status %d)",
            body.get("task_id"), self.agent_id, refusal.message, refusal.status,
        )  # fmt: skip
        return refusal.answer()

    def invoke(self, method: str, body: Mapping[str, Any]) -> Answer:
        """Run one delivery; returns (HTTP status, JSON envelope) once its handler ended,
        or 202 once it has run ``accept_after`` seconds (it goes on; see ``running``).

        It trusts its caller: the HTTP servers call `admit` first (``reach.sdk.dispatch``)."""
        begun = self._begin(method, body)
        if isinstance(begun, Delivery):
            run = self.runner.start(begun, self._routes[method])
            answer = run.wait(self.runner.accept_wait(body))
            return accepted() if answer is None else answer
        if isinstance(begun, Run):
            return _copy_answer(begun, begun.wait(self._copy_wait(body)))
        return begun

    async def invoke_async(
        self, method: str, body: Mapping[str, Any], executor: Executor | None = None
    ) -> Answer:
        """`invoke` on an event loop (the ASGI app's): an ``async def`` handler runs as a
        task on this loop, a plain one on the agent's threads; the bookkeeping before it
        (which may touch a dedup file) on ``executor``."""
        loop = asyncio.get_running_loop()
        begun = await loop.run_in_executor(executor, self._begin, method, body)
        if isinstance(begun, Delivery):
            run = self.runner.start(begun, self._routes[method], loop)
            answer = await run.wait_async(self.runner.accept_wait(body))
            return accepted() if answer is None else answer
        if isinstance(begun, Run):
            return _copy_answer(begun, await begun.wait_async(self._copy_wait(body)))
        return begun

    def _begin(self, method: str, body: Mapping[str, Any]) -> Answer | Delivery | Run:
        """A delivery's answer at once; or the `Delivery` to run (its slot taken); or the
        `Run` of this task under way here (the delivery is a copy of it)."""
        if method not in self._routes:
            return 404, {"code": 404, "message": f"no handler for method {method!r}"}
        task_id = body.get("task_id")
        payload = body.get("payload", {})
        if not isinstance(task_id, str) or not task_id or not isinstance(payload, dict):
            return 400, {"code": 400, "message": "body needs task_id (string) and payload (object)"}
        self._remember_attempt(task_id, body)  # before the handler: it may report at once
        begin = self.dedup.begin(task_id)
        if begin.action == "done":
            return begin.answer  # type: ignore[no-any-return]
        if begin.action == "running":
            run = self.runner.running(task_id)
            if run is not None:
                return run
            # Begun, not started yet (or a guard's own writer): wait a little for its answer.
            assert begin.running is not None
            finished = begin.running.wait(timeout=_duplicate_wait(body))
            answer = self.dedup.answer_of(task_id)
            if answer is not None:
                return answer  # type: ignore[no-any-return]
            if finished:  # the first copy failed transiently: let the hub retry
                return _FIRST_COPY_FAILED
            return accepted("already running")
        if not self.runner.claim():
            self.dedup.finish(task_id, None, remember=False)
            return 429, {"code": 429, "message": "agent at max_concurrency"}
        return Delivery.of(method, body, time.time())

    def _copy_wait(self, body: Mapping[str, Any]) -> float:
        """How long a copy of a running task waits for the first copy's answer."""
        wait = self.runner.accept_wait(body)
        return _duplicate_wait(body) if wait is None else wait

    # -- results after 202 ------------------------------------------------------------------
    def report_result(
        self,
        task_id: str,
        data: Any = None,
        *,
        code: int = 0,
        message: str = "",
        attempt_seq: int | None = None,
        transient: bool = False,
    ) -> bool:
        """Report the result of a task this agent accepted (its handler returned ACCEPTED);
        True if this report decided the task.

        The report names this instance and the attempt it was delivered (the latest, or
        ``attempt_seq``): the hub refuses it (``StaleReport``) if the task has moved on to
        another attempt or instance meanwhile. ``transient=True`` reports a failure that
        may pass (``message`` says what): the hub retries the task as it would after a
        5xx, and this agent's dedup guard forgets the task so the retry runs it again.
        (A handler that simply returns, or raises, is reported by the SDK itself.)
        """
        seq = self._attempt_to_report(task_id, attempt_seq)
        if transient:
            self.dedup.finish(task_id, None, remember=False)
        else:
            final = (
                {"code": code, "data": data} if code == 0 else {"code": code, "message": message}
            )
            self.dedup.finish(task_id, (200, final), remember=True)
        return self._post_result(
            task_id, seq, data=data, code=code, message=message, transient=transient
        )

    def _post_result(
        self,
        task_id: str,
        attempt_seq: int,
        *,
        data: Any = None,
        code: int = 0,
        message: str = "",
        transient: bool = False,
    ) -> bool:
        """``POST /v1/tasks/{id}/result`` naming this instance and ``attempt_seq``.
        A transient failure is ``code -1`` with ``"transient": true``."""
        call = result_call(
            task_id, None if transient else data, code=(code or -1) if transient else code,
            message=message, attempt_seq=attempt_seq, instance_id=self.instance_id,
            transient=transient,
        )  # fmt: skip
        assert call.data is not None
        return bool(self._reports.post(call.path, call.data, keys=call.keys)["decided"])

    def _post_keepalive(self, task_id: str, attempt_seq: int) -> None:
        """Tell the hub the handler of ``task_id`` still runs: its watchdog waits again
        (a ``keepalive`` progress report, which records no event)."""
        call = progress_call(
            task_id, None, "", None, attempt_seq=attempt_seq, instance_id=self.instance_id,
            keepalive=True,
        )  # fmt: skip
        assert call.data is not None
        self._reports.post(call.path, call.data)

    def report_progress(
        self,
        task_id: str,
        progress: float | None = None,
        message: str = "",
        *,
        attempt_seq: int | None = None,
    ) -> None:
        from reach.sdk.caller import report_progress

        report_progress(
            task_id,
            progress,
            message,
            attempt_seq=self._attempt_to_report(task_id, attempt_seq),
            instance_id=self.instance_id,
            hub=self.hub.base_url,
            api_key=self._api_key or "",
        )

    def _attempt_to_report(self, task_id: str, attempt_seq: int | None) -> int:
        seq = attempt_seq if attempt_seq is not None else self.accepted_attempt(task_id)
        if seq is None:
            raise StaleReport(
                f"{self.agent_id}/{self.instance_id} holds no delivery of task {task_id!r} "
                "(never delivered here, or forgotten): pass attempt_seq=",
                task_id=task_id,
            )
        return seq


def _checked_tls(tls: TLSConfig | None, addr: str, public_endpoint: str | None) -> TLSConfig | None:
    """With ``tls``, the hub must be told to use https: both addresses must say so, and the
    files must load (checked here, not at the first connection)."""
    if tls is None:
        return None
    for field, value in (("addr", addr), ("public_endpoint", public_endpoint)):
        if value is not None and parse_endpoint(value).scheme != "https":
            raise InvalidRegistration(
                f"{field}: an agent served with tls= must be reached at https://..., got {value!r}",
                field=field,
            )
    tls.server_context()
    return tls


_FIRST_COPY_FAILED: Answer = (503, {"code": -1, "message": "first copy of this task failed; retry"})


def _copy_answer(run: Run, answer: Answer | None) -> Answer:
    """What a copy of a running task is answered: the first copy's answer if it came in
    time (a transient failure: retry), else 202 (the run reports to the hub)."""
    if answer is None:
        return accepted("already running")
    return _FIRST_COPY_FAILED if run.failed else answer


def _duplicate_wait(body: Mapping[str, Any]) -> float:
    deadline = body.get("deadline")
    if isinstance(deadline, int | float):
        return max(0.0, min(30.0, deadline - time.time()))
    return 5.0


class _AgentHTTPServer(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG  # see reach.sdk.tls.LISTEN_BACKLOG


def _make_request_handler(agent: Agent) -> type[BaseHTTPRequestHandler]:
    root = parse_endpoint(agent.declaration.addr).path

    class RequestHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "reach-agent"
        # Headers and body leave in separate writes; with Nagle on, the body waits for the
        # peer's delayed ACK and every keep-alive answer costs ~40 ms.
        disable_nagle_algorithm = True

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):
                pass  # the peer left early (a probe reads only the status line): not an error

        def _dispatch(self) -> None:
            path = unquote(urlsplit(self.path).path)
            length = self.headers.get("Content-Length")
            authorization = self.headers.get("Authorization")
            routed = dispatch(agent, self.command, path, length, root, authorization)
            if isinstance(routed, TaskCall):
                routed = routed.run(self.rfile.read(int(length or 0)))
            elif length not in (None, "0"):
                self.close_connection = True  # an unread body would read as the next request
            self._reply(routed)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

        def _reply(self, reply: Reply) -> None:
            data = reply.encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return RequestHandler
