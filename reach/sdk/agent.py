"""The agent SDK: register with the hub, heartbeat in the background, serve handlers over HTTP.

    agent = reach.Agent("doc-analyzer-01", tags=["doc"], addr="10.0.0.5:7001", hub="http://hub:8800")

    @agent.route("task.process")
    def handle(task_id: str, payload: dict) -> dict: ...

    agent.serve()

The heartbeat runs in its own thread with its own HTTP session, so a handler that hogs
its worker cannot stop the hub from hearing that the process is alive — and the load
fields it reports (in_flight rising while heartbeats stay fresh) are how the hub tells
"alive" from "able to take work". Handlers run on a pool bounded by ``max_concurrency``;
a request beyond it is answered 429 at once (backpressure), never queued invisibly.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from reach.core.endpoints import parse_endpoint
from reach.errors import (
    BusinessError,
    HubUnavailable,
    InvalidRegistration,
    LoopbackAddress,
    ReachError,
    UnknownInstance,
)
from reach.schemas import Capability, DeregisterRequest, HeartbeatRequest, RegisterRequest
from reach.sdk import trace
from reach.sdk.dedup import IdempotencyGuard
from reach.sdk.hub_client import HubClient

log = logging.getLogger("reach.sdk.agent")

Handler = Callable[[str, dict[str, Any]], Any]
MAX_REQUEST_BYTES = 1_048_576


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
    ) -> None:
        if not addr:
            raise InvalidRegistration("addr is required: the host:port the agent binds to")
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
        reachable = parse_endpoint(public_endpoint or addr)
        if reachable.is_unspecified:
            raise InvalidRegistration(
                f"{reachable.host} is not an address the hub can reach; bind there if you "
                "like, but set public_endpoint to the routable address"
            )
        if reachable.is_loopback and not allow_loopback:
            raise LoopbackAddress(
                f"{reachable.url} is a loopback address and the hub probes from its own host; "
                "give a routable addr or public_endpoint, or allow_loopback=True for local "
                "development"
            )
        self.hub = HubClient(hub)
        self._routes: dict[str, Handler] = {}
        self.dedup = IdempotencyGuard()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._in_flight = 0
        self._consecutive_failures = 0
        self._last_duration_ms: float | None = None
        self._registered = False
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._server: ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None

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
        with self._lock:
            return self._in_flight

    # -- handlers -----------------------------------------------------------------------
    def route(self, method: str) -> Callable[[Handler], Handler]:
        """Register ``fn(task_id, payload)`` as the handler of ``method``."""

        def decorator(fn: Handler) -> Handler:
            if method in self._routes:
                raise ValueError(f"method {method!r} already has a handler")
            self._routes[method] = fn
            return fn

        return decorator

    # -- hub conversation ---------------------------------------------------------------
    def register(self) -> dict[str, Any]:
        """Register this instance with the hub (idempotent: safe to call again)."""
        answer = self.hub.post("/v1/agents/register", self.declaration.model_dump(mode="json"))
        self._registered = True
        log.info("registered %s/%s at %s", self.agent_id, self.instance_id, answer.get("endpoint"))
        return answer

    def heartbeat(self) -> dict[str, Any]:
        """Send one heartbeat now; (re-)register if the hub does not know this instance."""
        if not self._registered:
            return self.register()
        with self._lock:
            body = HeartbeatRequest(
                agent_id=self.agent_id,
                instance_id=self.instance_id,
                current_load=self._in_flight / self.declaration.max_concurrency,
                in_flight=self._in_flight,
                max_concurrency=self.declaration.max_concurrency,
                last_task_duration_ms=self._last_duration_ms,
                consecutive_failure_count=self._consecutive_failures,
                sent_at=time.time(),
            )
        try:
            return self.hub.post("/v1/agents/heartbeat", body.model_dump(mode="json"))
        except UnknownInstance:
            log.warning("hub forgot %s/%s; registering again", self.agent_id, self.instance_id)
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
        if not self._registered:
            return
        body = DeregisterRequest(agent_id=self.agent_id, instance_id=self.instance_id)
        try:
            self.hub.post("/v1/agents/deregister", body.model_dump(mode="json"))
        except UnknownInstance:
            pass
        self._registered = False

    def _heartbeat_loop(self) -> None:
        interval = self.declaration.heartbeat_interval
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
            except HubUnavailable as exc:
                log.warning("heartbeat failed, hub unavailable: %s", exc)
            except ReachError as exc:
                log.error("heartbeat refused by hub: %s", exc)
            except Exception:
                log.exception("heartbeat failed unexpectedly")

    # -- serving --------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the HTTP server, register and start heartbeats; returns at once."""
        bind = parse_endpoint(self.declaration.addr)
        server = ThreadingHTTPServer((bind.host, bind.port), _make_request_handler(self))
        server.daemon_threads = True
        self._server = server
        self._server_thread = threading.Thread(
            target=server.serve_forever, name=f"reach-http-{self.agent_id}", daemon=True
        )
        self._server_thread.start()
        try:
            if not self._registered:
                self.register()
        except HubUnavailable as exc:
            # The hub may start after its agents; the heartbeat loop keeps trying.
            log.warning("hub unavailable, will register when it answers: %s", exc)
        except BaseException:
            self._close_server()
            raise
        self.start_heartbeat()

    def serve(self) -> None:
        """Serve until SIGINT/SIGTERM (or ``close()``), then deregister cleanly."""
        self.start()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self._stop.set())
        try:
            self._stop.wait()
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving and heartbeating, then deregister this instance."""
        self.stop_heartbeat()
        self._close_server()
        try:
            self.deregister()
        except HubUnavailable as exc:
            log.warning("could not deregister (hub unavailable): %s", exc)
        self.hub.close()

    def _close_server(self) -> None:
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
    def invoke(self, method: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """Run one delivery; returns (HTTP status, JSON envelope)."""
        handler = self._routes.get(method)
        if handler is None:
            return 404, {"code": 404, "message": f"no handler for method {method!r}"}
        task_id = body.get("task_id")
        payload = body.get("payload", {})
        if not isinstance(task_id, str) or not task_id or not isinstance(payload, dict):
            return 400, {"code": 400, "message": "body needs task_id (string) and payload (object)"}
        begin = self.dedup.begin(task_id)
        if begin.action == "done":
            return begin.answer  # type: ignore[no-any-return]
        if begin.action == "running":
            # A duplicate while the first copy runs: wait a little for its answer.
            assert begin.running is not None
            finished = begin.running.wait(timeout=_duplicate_wait(body))
            answer = self.dedup.answer_of(task_id)
            if answer is not None:
                return answer  # type: ignore[no-any-return]
            if finished:  # the first copy failed transiently: let the hub retry
                return 503, {"code": -1, "message": "first copy of this task failed; retry"}
            return 202, {"code": 0, "accepted": True, "message": "already running"}
        if not self._slots.acquire(blocking=False):
            self.dedup.finish(task_id, None, remember=False)
            return 429, {"code": 429, "message": "agent at max_concurrency"}
        with self._lock:
            self._in_flight += 1
        started = time.monotonic()
        failed = False
        status: int
        envelope: dict[str, Any]
        try:
            with trace.handling(task_id, body.get("trace"), self.agent_id, self.hub.base_url):
                value = handler(task_id, payload)
            if value is ACCEPTED:
                status, envelope = 202, {"code": 0, "accepted": True}
            else:
                status, envelope = 200, _envelope(value)
        except BusinessError as exc:
            status, envelope = 200, {"code": exc.code, "message": exc.message}
        except Exception as exc:
            failed = True
            log.exception("handler for %s failed on task %s", method, task_id)
            status, envelope = 500, {"code": -1, "message": f"{type(exc).__name__}: {exc}"}
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_duration_ms = (time.monotonic() - started) * 1000
                self._consecutive_failures = self._consecutive_failures + 1 if failed else 0
            self._slots.release()
        # A transient failure is not remembered: the hub's retry must run the handler again.
        self.dedup.finish(task_id, (status, envelope), remember=not failed)
        return status, envelope

    # -- results after 202 ------------------------------------------------------------------
    def report_result(
        self, task_id: str, data: Any = None, *, code: int = 0, message: str = ""
    ) -> bool:
        """Report the result of a task this agent accepted (its handler returned ACCEPTED)."""
        from reach.sdk.caller import report_result

        answer = (
            200,
            {"code": code, "data": data} if code == 0 else {"code": code, "message": message},
        )
        self.dedup.finish(task_id, answer, remember=True)
        return report_result(task_id, data, code=code, message=message, hub=self.hub.base_url)

    def report_progress(
        self, task_id: str, progress: float | None = None, message: str = ""
    ) -> None:
        from reach.sdk.caller import report_progress

        report_progress(task_id, progress, message, hub=self.hub.base_url)


class _Accepted:
    """Returned by a handler that will report its result later (the hub sees 202)."""

    def __repr__(self) -> str:
        return "reach.ACCEPTED"


ACCEPTED = _Accepted()


def _duplicate_wait(body: Mapping[str, Any]) -> float:
    deadline = body.get("deadline")
    if isinstance(deadline, int | float):
        return max(0.0, min(30.0, deadline - time.time()))
    return 5.0


def _envelope(value: Any) -> dict[str, Any]:
    """A plain return is ``{"code": 0, "data": value}``; a dict with an int code passes through."""
    if (
        isinstance(value, dict)
        and isinstance(value.get("code"), int)
        and not isinstance(value.get("code"), bool)
    ):
        return value
    return {"code": 0, "data": value}


def _make_request_handler(agent: Agent) -> type[BaseHTTPRequestHandler]:
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

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._reply(
                    200,
                    {
                        "status": "ok",
                        "agent_id": agent.agent_id,
                        "instance_id": agent.instance_id,
                        "in_flight": agent.in_flight,
                    },
                )
            else:
                self._reply(404, {"code": 404, "message": "not found"})

        def do_POST(self) -> None:
            prefix = "/tasks/"
            if not self.path.startswith(prefix):
                self._reply(404, {"code": 404, "message": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                self._reply(413, {"code": 413, "message": "request body too large"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._reply(400, {"code": 400, "message": "body is not JSON"})
                return
            if not isinstance(body, dict):
                self._reply(400, {"code": 400, "message": "body must be a JSON object"})
                return
            status, envelope = agent.invoke(self.path[len(prefix) :], body)
            self._reply(status, envelope)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return RequestHandler
