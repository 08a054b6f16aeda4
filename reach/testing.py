"""A test kit: an agent's handlers and a caller's code against a stand-in hub, in one process.

    from reach.testing import StubHub

    def test_summarise():
        with StubHub() as hub:
            run = hub.deliver(agent, "text.summarise", {"text": "a long text"})
            assert run.status == "success" and run.result == {"summary": "a text"}

    def test_caller():
        with StubHub() as hub:
            fake = hub.agent("doc-analyzer-01", tags=["doc"])

            @fake.route("task.process")
            def process(task_id: str, payload: dict) -> dict:
                return {"pages": 3}

            sub = reach.send(agent_id="doc-analyzer-01", method="task.process", hub=hub.url)
            assert reach.wait_for_result(sub.task_id, hub=hub.url).data == {"pages": 3}

`StubHub` plays the hub for both sides, as dramatiq's ``StubBroker`` plays a broker:

- **For an agent** (`StubHub.deliver`): a delivery is made as the hub makes it -- the body
  encoded once, a reach token signed by a throwaway hub key (`HubKey`) and bound to the
  agent, the task, the attempt, the method and those exact bytes -- and handed to the
  agent's own ASGI app (``reach.sdk.asgi``, ``reach.sdk.dispatch``): the token check, the
  dedup guard, ``max_concurrency``, sync and ``async def`` handlers, the 202 after
  ``accept_after`` and the later report all run as in production, without binding a port
  for the agent. A forged token, or one for another agent, is refused with the 401 a
  deployed agent gives. The answer is read with the hub's own rules
  (``reach.core.delivery``), and `Delivered` holds what the hub would record: the
  outcome, the task's status, its result or error, and the progress reported.
- **For a caller**: ``reach.send``, ``reach.wait_for_result``, ``reach.get_task``,
  ``reach.broadcast`` and their ``reach.aio`` twins talk HTTP to ``hub.url``, a server on
  127.0.0.1 in a thread of the test, which routes each task to the agents added to it
  (`StubHub.agent`, `StubHub.add`) by ``agent_id``, ``tags``, ``capability`` and ``rules``
  and delivers it as above. Pass ``hub=hub.url``, or set ``REACH_HUB_URL`` for the test
  (pytest's ``monkeypatch.setenv("REACH_HUB_URL", hub.url)``) so code that names no hub
  finds it. The same server takes the agents' progress and result reports and serves the
  key their tokens are checked with (``/.well-known/jwks.json``).

What it leaves out, on purpose: no database and no broker (tasks live in memory), no API
keys checked, retries made at once (``max_retry``, no backoff), and none of the hub's
breakers, admission, approvals, sessions, streams, callbacks or semantic matching (an
``intent`` raises ``SemanticMatchingOff``). Test those against a real hub.

This module imports nothing of the hub (a contract in CI): it ships with the SDK.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from reach.core.delivery.answers import declared_message, described_body
from reach.core.delivery.retry import Outcome, business_message, classify
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.security.tokens import ALGORITHM, body_digest, claims_for, public_jwk
from reach.errors import (
    InvalidTaskRequest,
    NoSuitableAgent,
    ReachError,
    SemanticMatchingOff,
    StaleReport,
    UnknownTask,
)
from reach.sdk.agent import Agent
from reach.sdk.aio_client import aclose
from reach.sdk.caller import outcome
from reach.wire.schemas import BroadcastRequest, ProgressReport, ResultReport, SubmitRequest

if TYPE_CHECKING:
    from reach.sdk.asgi import AgentApp

__all__ = ["MINTED", "Delivered", "HubKey", "Progress", "StubHub"]

T = TypeVar("T")

ANONYMOUS = "anonymous"  # the ``sub`` of a task no key submitted (an open hub)


class _Minted:
    def __repr__(self) -> str:
        return "MINTED"


MINTED: Final = _Minted()
"""`StubHub.deliver`'s default ``authorization``: a token minted as the hub would."""


class HubKey:
    """A throwaway hub signing key (Ed25519): what a hub signs reach tokens with, made in
    memory for one test. `StubHub` publishes its key at ``/.well-known/jwks.json``; a
    second `HubKey` is a stranger's, whose tokens agents must refuse."""

    def __init__(self, issuer: str = "reach-stub-hub") -> None:
        self._private = Ed25519PrivateKey.generate()
        self.jwk = public_jwk(self._private)
        self.kid = self.jwk["kid"]
        self.issuer = issuer

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWK Set a hub with this key publishes."""
        return {"keys": [dict(self.jwk)]}

    def mint(
        self,
        *,
        audience: str,
        task_id: str,
        method: str,
        body: bytes,
        attempt_seq: int = 1,
        subject: str = ANONYMOUS,
        now: float | None = None,
        ttl_s: float = 300.0,
        kid: str | None = None,
    ) -> str:
        """A reach token for one delivery of ``body`` (its exact bytes) to ``audience``'s
        ``method``, as the hub signs it (``reach.core.security.tokens``). ``now`` in the
        past makes an expired one; ``kid`` another key's id makes one whose signature
        does not verify."""
        claims = claims_for(
            self.issuer, subject, audience, task_id, attempt_seq,
            time.time() if now is None else now, ttl_s, uuid.uuid4().hex,
            method=method, body_sha256=body_digest(body),
        )  # fmt: skip
        return jwt.encode(
            claims, self._private, algorithm=ALGORITHM, headers={"kid": kid or self.kid}
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress report a handler made (keepalives are not recorded)."""

    progress: float | None
    message: str
    data: Any
    attempt_seq: int


@dataclass(frozen=True, slots=True)
class Delivered:
    """One delivery of a task to an agent, and what the hub recorded of it.

    ``outcome`` is the hub's reading of the agent's answer (``success``,
    ``business_error``, ``accepted``, ``backpressure``, ``transient``); ``status`` the
    task's status after it: ``success``, ``failed``, ``pending`` (the hub would retry: a
    transient failure or backpressure), or ``executing`` (answered 202 and not reported
    within the ``timeout``). After a 202, ``result``, ``error`` and ``status`` are those of
    the agent's later report."""

    task_id: str
    method: str
    attempt_seq: int
    http_status: int
    answer: Any
    outcome: str
    status: str
    result: Any
    error: dict[str, Any] | None
    progress: tuple[Progress, ...]
    task: dict[str, Any]

    @property
    def refused(self) -> bool:
        """Whether the agent refused the delivery's reach token (401)."""
        return self.http_status == 401

    def value(self) -> Any:
        """The result, or the typed error ``reach.wait_for_result`` would raise
        (``BusinessError`` for a failure; `ReachError` while the task is not ended)."""
        if self.status not in TERMINAL:
            raise ReachError(f"task {self.task_id} is {self.status}", task_id=self.task_id)
        return outcome(self.task).data


@dataclass(eq=False)
class _Task:
    """One task in the stub's memory; guarded by the hub's lock."""

    task_id: str
    method: str
    payload: dict[str, Any]
    timeout_ms: int
    trace: dict[str, Any] | None = None
    session_id: str | None = None
    max_retry: int | None = None  # None: one attempt only (`StubHub.deliver`)
    retries: int = 0
    status: str = TaskStatus.PENDING
    attempt_seq: int = 0
    agent: Agent | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    progress: list[Progress] = field(default_factory=list)
    version: int = 0  # bumped on every change: long-polls wait for it

    def view(self) -> dict[str, Any]:
        """The task as ``GET /v1/tasks/{id}`` shows it (the fields the SDK reads)."""
        return {
            "task_id": self.task_id,
            "status": str(self.status),
            "method": self.method,
            "payload": self.payload,
            "attempt_seq": self.attempt_seq,
            "agent_id": None if self.agent is None else self.agent.agent_id,
            "instance_id": None if self.agent is None else self.agent.instance_id,
            "result": self.result,
            "error": self.error,
            "progress": [
                {"progress": p.progress, "message": p.message, "data": p.data}
                for p in self.progress
            ],
            "session_id": self.session_id,
            "trace": self.trace,
        }


@dataclass(eq=False)
class _Broadcast:
    broadcast_id: str
    tasks: list[_Task]
    min_results: int
    deadline: float


class StubHub:
    """A stand-in hub in this process: see the module docstring. Use it as a context
    manager (or call `close`); it serves from construction on.

    ``max_retry``: how often a task sent through it is delivered again after a transient
    failure or backpressure (at once), before it is dead-lettered. ``key``: the hub's
    signing key (a fresh `HubKey` by default)."""

    __test__ = False  # not a test class, whatever pytest makes of the name

    def __init__(self, *, key: HubKey | None = None, max_retry: int = 2) -> None:
        self.key = key or HubKey()
        self.max_retry = max_retry
        self._lock = threading.Condition()
        self._agents: list[Agent] = []
        self._apps: dict[int, AgentApp] = {}
        self._tasks: dict[str, _Task] = {}
        self._broadcasts: dict[str, _Broadcast] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="reach-stub-hub-loop", daemon=True
        )
        self._loop_thread.start()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="reach-stub-hub", daemon=True
        )
        self._server_thread.start()

    def __repr__(self) -> str:
        return f"StubHub({self.url!r}, agents={len(self._agents)}, tasks={len(self._tasks)})"

    def __enter__(self) -> StubHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving: handlers still running are cancelled (async) or left to end (sync)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()  # long-polls answer now
        self._server.shutdown()
        self._server.server_close()
        try:
            asyncio.run_coroutine_threadsafe(self._wind_down(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
            self._loop.close()
        for agent in self._agents:
            agent.runner.close()

    async def _wind_down(self) -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for app in self._apps.values():
            app._release_pool()
        await aclose()  # handlers' reach.aio pool on this loop
        await self._loop.shutdown_asyncgens()

    # -- agents ---------------------------------------------------------------------------
    def agent(
        self,
        agent_id: str,
        tags: Sequence[str] = (),
        capabilities: Sequence[Any] = (),
        **options: Any,
    ) -> Agent:
        """A new `reach.Agent` of this hub (tasks sent here reach it): give it handlers
        with ``@agent.route(method)``. ``options`` are the Agent's (``max_concurrency``,
        ``accept_after``, ``metadata`` ...); no port is bound for it."""
        made = Agent(
            agent_id,
            tags=tags,
            addr="http://127.0.0.1:9",  # never dialled: deliveries go to its ASGI app
            capabilities=capabilities,
            hub=self.url,
            allow_loopback=True,
            **options,
        )
        return self.add(made)

    def add(self, agent: Agent) -> Agent:
        """Route tasks sent here to ``agent`` (an instance of your own, built with any hub
        URL): it is pointed at this hub, whose key its token checks now trust and where
        its progress and result reports now go. Returns it."""
        with self._lock:
            if any(a is agent for a in self._agents):
                return agent
            self._agents.append(agent)
        agent.hub.close()
        agent._use_hub(self.url, agent.tokens is not None)
        return agent

    @property
    def agents(self) -> list[Agent]:
        with self._lock:
            return list(self._agents)

    # -- deliveries -----------------------------------------------------------------------
    def deliver(
        self,
        agent: Agent,
        method: str,
        payload: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        attempt_seq: int = 1,
        timeout: float = 30.0,
        audience: str | None = None,
        key: HubKey | None = None,
        kid: str | None = None,
        authorization: str | _Minted | None = MINTED,
        trace: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Delivered:
        """Deliver one attempt of a task to ``agent`` (added to this hub if it was not)
        and return what the hub records of it, waiting up to ``timeout`` s for a handler
        answered 202 to report. The token names ``audience`` (default: the agent) and
        is signed with ``key`` (default: this hub's) under the key id ``kid`` (default:
        the key's own; this hub's with another key is a forgery whose signature does not
        verify); ``authorization`` replaces the whole header (None: no token at all). A
        failure is not retried here; deliver the same ``task_id`` again with a later
        ``attempt_seq`` to test a redelivery."""
        future = self._submit_to_loop(
            self._deliver(
                agent, method, payload, task_id=task_id, attempt_seq=attempt_seq,
                timeout=timeout, audience=audience, key=key, kid=kid, authorization=authorization,
                trace=trace, session_id=session_id,
            )
        )  # fmt: skip
        task, status, answer, seen = future.result(timeout=timeout + 30)
        self._wait_settled(task, timeout)
        return self._delivered(task, status, answer, seen)

    async def adeliver(
        self,
        agent: Agent,
        method: str,
        payload: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Delivered:
        """`deliver` for a test that runs on an event loop (the same options)."""
        return await asyncio.to_thread(self.deliver, agent, method, payload, **options)

    async def _deliver(
        self,
        agent: Agent,
        method: str,
        payload: Mapping[str, Any] | None,
        *,
        task_id: str | None,
        attempt_seq: int,
        timeout: float,
        audience: str | None,
        key: HubKey | None,
        kid: str | None,
        authorization: str | _Minted | None,
        trace: Mapping[str, Any] | None,
        session_id: str | None,
    ) -> tuple[_Task, int, Any, Outcome]:
        self.add(agent)
        task = _Task(
            task_id or uuid.uuid4().hex,
            method,
            dict(payload or {}),
            max(1, int(timeout * 1000)),
            trace=dict(trace) if trace is not None else None,
            session_id=session_id,
            attempt_seq=attempt_seq - 1,
        )
        with self._lock:
            known = self._tasks.get(task.task_id)
            if known is not None:  # a redelivery: a later attempt of the same task
                if attempt_seq <= known.attempt_seq:
                    raise ValueError(
                        f"task {task.task_id!r} had attempt {known.attempt_seq} already: "
                        "a redelivery needs a later attempt_seq"
                    )
                known.attempt_seq, known.result, known.error = attempt_seq - 1, None, None
                task = known
            else:
                self._tasks[task.task_id] = task
        return (task, *await self._attempt(task, agent, audience, key, kid, authorization))

    def _delivered(self, task: _Task, status: int, answer: Any, seen: Outcome) -> Delivered:
        with self._lock:
            return Delivered(
                task.task_id, task.method, task.attempt_seq, status, answer, seen.value,
                str(task.status), task.result, task.error, tuple(task.progress), task.view(),
            )  # fmt: skip

    def _wait_settled(self, task: _Task, timeout: float) -> None:
        """Until an accepted task is reported (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while task.status == TaskStatus.EXECUTING and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._lock.wait(left)

    async def _attempt(
        self,
        task: _Task,
        agent: Agent,
        audience: str | None = None,
        key: HubKey | None = None,
        kid: str | None = None,
        authorization: str | _Minted | None = MINTED,
    ) -> tuple[int, Any, Outcome]:
        """One attempt of ``task`` to ``agent``, recorded as the hub records it."""
        with self._lock:
            task.attempt_seq += 1
            task.agent = agent
            self._change(task, TaskStatus.DISPATCHING)
            body = {
                "task_id": task.task_id,
                "method": task.method,
                "payload": task.payload,
                "attempt_seq": task.attempt_seq,
                "idempotency_key": task.task_id,
                "trace": task.trace,
                "session_id": task.session_id,
                "deadline": time.time() + task.timeout_ms / 1000,
            }
        raw = json.dumps(body, separators=(",", ":")).encode()  # the bytes the token binds
        if isinstance(authorization, _Minted):
            token = (key or self.key).mint(
                audience=audience or agent.agent_id,
                task_id=task.task_id,
                method=task.method,
                body=raw,
                attempt_seq=task.attempt_seq,
                kid=kid,
            )
            authorization = f"Bearer {token}"
        status, answer = await _post(self._app(agent), task.method, raw, authorization)
        seen = classify(status, answer)
        with self._lock:
            self._record(task, seen, status, answer)
        return status, answer, seen

    def _app(self, agent: Agent) -> AgentApp:
        with self._lock:
            app = self._apps.get(id(agent))
            if app is None:
                app = self._apps[id(agent)] = agent.asgi_app()
            return app

    def _record(self, task: _Task, seen: Outcome, status: int, answer: Any) -> None:
        """The hub's reading of an agent's answer (``reach.hub.delivery.outcomes``)."""
        body = answer if isinstance(answer, dict) else {}
        if seen is Outcome.SUCCESS:
            task.result = body.get("data")
            self._change(task, TaskStatus.SUCCESS)
        elif seen is Outcome.BUSINESS_ERROR:
            code = body.get("code")
            message = declared_message(answer) or described_body(status, answer)
            task.error = {
                "kind": "business",
                "code": code if isinstance(code, int) and not isinstance(code, bool) else status,
                "message": business_message(status, message),
                "http_status": status,
            }
            self._change(task, TaskStatus.FAILED)
        elif seen is Outcome.ACCEPTED:
            self._change(task, TaskStatus.EXECUTING)
        else:
            message = declared_message(answer) or described_body(status, answer)
            self._failed_transiently(
                task, {"kind": "http", "http_status": status, "message": message}
            )

    def _failed_transiently(self, task: _Task, error: dict[str, Any]) -> None:
        """A failure a retry may mend: deliver again while retries are left, else dead."""
        assert task.agent is not None
        task.error = {**error, "instance_id": task.agent.instance_id}
        if task.max_retry is None or self._closed:  # a single `deliver`: the hub would retry
            self._change(task, TaskStatus.PENDING)
        elif task.retries < task.max_retry:
            task.retries += 1
            self._change(task, TaskStatus.PENDING)
            self._submit_to_loop(self._attempt(task, task.agent))
        else:
            task.error["reason"] = f"{task.retries} retries exhausted"
            self._change(task, TaskStatus.DEAD)

    def _change(self, task: _Task, status: str) -> None:
        task.status = status
        task.version += 1
        self._lock.notify_all()

    def _submit_to_loop(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise RuntimeError("this StubHub is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # -- the tasks it holds -----------------------------------------------------------------
    def task(self, task_id: str) -> dict[str, Any]:
        """The task's view, as ``reach.get_task`` shows it."""
        with self._lock:
            found = self._tasks.get(task_id)
            if found is None:
                raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
            return found.view()

    def tasks(self) -> list[dict[str, Any]]:
        """Every task this hub holds, in the order they came."""
        with self._lock:
            return [t.view() for t in self._tasks.values()]

    # -- the hub's API (called on the server's threads) --------------------------------------
    def _submit(self, body: dict[str, Any]) -> dict[str, Any]:
        req = _valid(SubmitRequest, body)
        if req.intent is not None:
            raise SemanticMatchingOff(
                "a StubHub has no embedding model: name an agent_id, tags or a capability",
                reason="reach.testing.StubHub does no semantic matching",
            )
        assert req.method is not None
        with self._lock:
            if req.task_id is not None and req.task_id in self._tasks:
                known = self._tasks[req.task_id]  # idempotent on task_id
                return {"task_id": known.task_id, "status": str(known.status)}
            targets = self._matching(req.agent_id, req.tags, req.capability, req.rules)
            if not targets:
                raise NoSuitableAgent(_no_match(req.agent_id, req.tags, req.capability))
            task = _Task(
                req.task_id or uuid.uuid4().hex,
                req.method,
                req.payload,
                req.timeout_ms,
                trace=req.trace.model_dump(mode="json") if req.trace is not None else None,
                session_id=req.session_id,
                max_retry=self.max_retry,
            )
            self._tasks[task.task_id] = task
            chosen = targets[len(self._tasks) % len(targets)]  # turns among the candidates
        self._submit_to_loop(self._attempt(task, chosen))
        return {
            "task_id": task.task_id,
            "status": str(TaskStatus.PENDING),
            "agent_id": chosen.agent_id,
            "method": task.method,
        }

    def _matching(
        self,
        agent_id: str | None,
        tags: Iterable[str],
        capability: str | None,
        rules: Mapping[str, Any],
    ) -> list[Agent]:
        wanted = set(tags)
        found = []
        for agent in self._agents:
            d = agent.declaration
            if agent_id is not None and d.agent_id != agent_id:
                continue
            if not wanted <= set(d.tags):
                continue
            if capability is not None and capability not in {c.type for c in d.capabilities}:
                continue
            if any(d.metadata.get(k) != v for k, v in rules.items()):
                continue
            found.append(agent)
        return found

    def _read(self, task_id: str, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + min(wait, 30.0)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
            seen = task.version
            while task.version == seen and task.status not in TERMINAL and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return task.view()

    def _reported(self, task_id: str, instance_id: str, attempt_seq: int) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
        agent = task.agent
        if (
            agent is None
            or agent.instance_id != instance_id
            or task.attempt_seq != attempt_seq
            or task.status not in (TaskStatus.DISPATCHING, TaskStatus.EXECUTING)
        ) and task.status not in TERMINAL:
            raise StaleReport(
                f"task {task_id} waits on another attempt or instance", task_id=task_id
            )
        return task

    def _result(self, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
        report = _valid(ResultReport, body)
        with self._lock:
            task = self._reported(task_id, report.instance_id, report.attempt_seq)
            if task.status in TERMINAL:
                return {"decided": False}  # the first result won
            if report.transient:
                self._failed_transiently(task, {"kind": "reported", "message": report.message})
            elif report.code == 0:
                task.result = report.data
                self._change(task, TaskStatus.SUCCESS)
            else:
                task.error = {"kind": "business", "code": report.code, "message": report.message}
                self._change(task, TaskStatus.FAILED)
            return {"decided": True}

    def _progress(self, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
        report = _valid(ProgressReport, body)
        with self._lock:
            task = self._reported(task_id, report.instance_id, report.attempt_seq)
            if not report.keepalive and task.status not in TERMINAL:
                task.progress.append(
                    Progress(report.progress, report.message, report.data, report.attempt_seq)
                )
                task.version += 1
                self._lock.notify_all()
            return {"task_id": task_id, "status": str(task.status)}

    def _broadcast(self, body: dict[str, Any]) -> dict[str, Any]:
        req = _valid(BroadcastRequest, body)
        with self._lock:
            targets = self._matching(None, req.tags, req.capability, req.rules)
            if not targets:
                raise NoSuitableAgent(_no_match(None, req.tags, req.capability))
            tasks = [
                _Task(uuid.uuid4().hex, req.method, req.payload, req.timeout_ms,
                      max_retry=req.max_retry)
                for _ in targets
            ]  # fmt: skip
            for task in tasks:
                self._tasks[task.task_id] = task
            cast = _Broadcast(
                uuid.uuid4().hex,
                tasks,
                min(req.min_results or len(tasks), len(tasks)),
                time.time() + req.timeout_ms / 1000,
            )
            self._broadcasts[cast.broadcast_id] = cast
        for task, agent in zip(tasks, targets, strict=True):
            self._submit_to_loop(self._attempt(task, agent))
        with self._lock:
            return _aggregate(cast)

    def _broadcast_view(self, broadcast_id: str, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + min(wait, 30.0)
        with self._lock:
            cast = self._broadcasts.get(broadcast_id)
            if cast is None:
                raise UnknownTask(f"broadcast {broadcast_id!r} does not exist")
            view = _aggregate(cast)
            while not view["complete"] and not self._closed:
                left = min(deadline - time.monotonic(), cast.deadline - time.time())
                if left <= 0:
                    break
                self._lock.wait(left)
                view = _aggregate(cast)
            return _aggregate(cast)

    def _answer(self, verb: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        """What the hub's API answers (raises the `ReachError` of a refusal)."""
        wait = float((query.get("wait") or ["0"])[0])
        parts = path.strip("/").split("/")
        if verb == "GET" and path == "/.well-known/jwks.json":
            return self.key.jwks()
        if verb == "POST" and path == "/v1/agents/register":
            return {"agent_id": body.get("agent_id"), "endpoint": body.get("addr")}
        if verb == "POST" and path in ("/v1/agents/heartbeat", "/v1/agents/deregister"):
            return {}
        if verb == "POST" and path == "/v1/tasks":
            return self._submit(body)
        if parts[:2] == ["v1", "tasks"] and len(parts) == 3 and verb == "GET":
            return self._read(parts[2], wait)
        if parts[:2] == ["v1", "tasks"] and len(parts) == 4 and verb == "POST":
            if parts[3] == "result":
                return self._result(parts[2], body)
            if parts[3] == "progress":
                return self._progress(parts[2], body)
        if verb == "POST" and path == "/v1/broadcasts":
            return self._broadcast(body)
        if parts[:2] == ["v1", "broadcasts"] and len(parts) == 3 and verb == "GET":
            return self._broadcast_view(parts[2], wait)
        raise _NotServed(f"a StubHub does not serve {verb} {path}")


class _NotServed(ReachError):
    """The stub does not serve this path (the real hub may)."""

    slug = "not-found"
    status = 404
    title = "Not served by the stub hub"


def _valid(model: Any, body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidTaskRequest(f"{where}: {first['msg']}", field=where) from None


def _no_match(agent_id: str | None, tags: Iterable[str], capability: str | None) -> str:
    wanted = {"agent_id": agent_id, "tags": list(tags) or None, "capability": capability}
    named = ", ".join(f"{k}={v!r}" for k, v in wanted.items() if v)
    return f"no agent of this StubHub matches {named or 'the request'}"


def _aggregate(cast: _Broadcast) -> dict[str, Any]:
    """A broadcast's view, as the hub aggregates it (``reach.hub.orchestration``)."""
    results = [
        {
            "agent_id": None if t.agent is None else t.agent.agent_id,
            "instance_id": None if t.agent is None else t.agent.instance_id,
            "task_id": t.task_id,
            "status": str(t.status),
            "data": t.result,
            "error": t.error,
        }
        for t in cast.tasks
    ]
    succeeded = sum(1 for r in results if r["status"] == TaskStatus.SUCCESS)
    if succeeded >= cast.min_results:
        complete, reason = (
            True,
            f"{succeeded} of {len(results)} succeeded (needed {cast.min_results})",
        )
    elif all(r["status"] in TERMINAL for r in results):
        complete, reason = True, f"all targets finished; {succeeded} succeeded"
    elif time.time() >= cast.deadline:
        complete, reason = True, f"deadline passed with {succeeded} of {cast.min_results} results"
    else:
        complete, reason = False, f"{succeeded} of {cast.min_results} results so far"
    return {
        "broadcast_id": cast.broadcast_id,
        "complete": complete,
        "reason": reason,
        "min_results": cast.min_results,
        "succeeded": succeeded,
        "deadline": cast.deadline,
        "results": results,
    }


async def _post(
    app: AgentApp, method: str, raw: bytes, authorization: str | None
) -> tuple[int, Any]:
    """POST ``raw`` to ``/tasks/{method}`` of the agent's ASGI app, in this process; its
    status and parsed body (None when it is not JSON)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode("latin-1")))
    path = f"/tasks/{method}"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    answered = asyncio.Event()
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    answered.set()
    try:
        return status, json.loads(b"".join(chunks))
    except ValueError:
        return status, None


def _handler(hub: StubHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "reach-stub-hub"

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
                status, answer = 200, hub._answer(self.command, url.path, parse_qs(url.query), body)
            except ReachError as exc:
                status, answer = exc.status, exc.to_problem(url.path)
            except ValueError as exc:
                status, answer = 400, {"type": "about:blank", "status": 400, "detail": str(exc)}
            data = json.dumps(answer).encode()
            self.send_response(status)
            kind = "application/problem+json" if status >= 400 else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a test's output is the test's

    return Handler
