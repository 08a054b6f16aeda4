"""Running handlers: plain functions on threads, ``async def`` ones on an event loop, and an
answer for the hub in time however long they think.

Where a handler runs:

- ``def``: on daemon threads of the agent's own, started on demand and reused (a handler
  that never returns cannot hold the process at exit, as a ThreadPoolExecutor's would);
- ``async def``: as a task on the event loop of the server that took the delivery
  (uvicorn's, for ``agent.asgi_app()``), else on an event loop the agent starts in a
  thread of its own the first time it needs one (the built-in server, the channel).

Both kinds take a slot of one ``max_concurrency`` bound (`Runner.claim`): a delivery past
it is answered 429 at once. A handler's context (trace, hub, API key, session:
``reach.sdk.trace``) is set inside the thread or coroutine that runs it, so a
``reach.send`` made there continues the trace as the handler's agent.

A handler's value must be JSON (strict, as the hub reads it: no NaN or Infinity). Anything
else -- the coroutine of a forgotten ``await``, a generator, a set, bytes, an object --
fails the attempt with a 500 naming the method and the type (`outcome`): a transient
failure the hub retries, never a success holding a repr.

A delivery waits for its handler at most ``accept_after`` seconds (`accept_wait`, shorter
when the delivery's ``deadline`` is near). A handler done by then is answered as always;
one still thinking is answered ``202 {"code": 0, "accepted": true}`` and goes on. While it
runs, the agent tells the hub it is alive (`keepalive_interval`; ``POST
/v1/tasks/{id}/progress {"keepalive": true}`` pushes the task's watchdog back), and when
it ends, its outcome is reported (``POST /v1/tasks/{id}/result``, naming the latest
attempt this instance was delivered): its value, its business error, or a transient
failure (``"transient": true``) that the hub retries as it would a 5xx. A report that
finds the hub unavailable is retried with backoff for `REPORT_PATIENCE_S` (a hub restart
does not lose a result); one the hub refuses as stale (it moved on) is logged. A handler
that returns ``reach.ACCEPTED`` reports for itself, as before.

The dedup guard holds the final answer either way: a redelivery of the task while it runs
waits for that answer (at most as long as a first delivery would), or is answered 202 and
the report names its attempt; after a transient failure nothing is remembered, so the
hub's retry runs the handler again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reach.core.delivery import envelope
from reach.errors import BusinessError, HubUnavailable, ReachError, StaleReport
from reach.sdk import telemetry, trace

if TYPE_CHECKING:
    from reach.sdk.agent import Agent

log = logging.getLogger("reach.sdk.running")

Answer = tuple[int, dict[str, Any]]
Handler = Callable[[str, dict[str, Any]], Any]

DEFAULT_ACCEPT_AFTER_S = 10.0
DEFAULT_BUDGET_S = 30.0
"""A delivery's time budget when it names no deadline: the hub's default task timeout."""
KEEPALIVE_MIN_S = 1.0
KEEPALIVE_MAX_S = 10.0
REPORT_PATIENCE_S = 300.0
"""How long a report is retried while the hub is unavailable (a restart, an outage)."""
REPORT_BACKOFF_FIRST_S = 0.5
REPORT_BACKOFF_MAX_S = 10.0
MAX_REPORT_MESSAGE = 10_000  # characters: the hub refuses a longer report message


class _Accepted:
    """Returned by a handler that will report its result later (the hub sees 202)."""

    def __repr__(self) -> str:
        return "reach.ACCEPTED"


ACCEPTED = _Accepted()


# -- decisions (pure) -----------------------------------------------------------------------
def accept_wait(accept_after: float | None, deadline: float | None, now: float) -> float | None:
    """Seconds a delivery waits for its handler before it is answered 202 (None: until it
    ends): ``accept_after``, or half the time left before the delivery's ``deadline`` when
    that is sooner, so the 202 reaches the hub well inside its exchange."""
    if accept_after is None:
        return None
    if deadline is None:
        return accept_after
    return max(0.0, min(accept_after, (deadline - now) / 2))


def keepalive_interval(budget: float) -> float:
    """Seconds between keepalives of a run answered 202: a third of the delivery's time
    budget (its deadline less its arrival), within 1 and 10 s."""
    return max(KEEPALIVE_MIN_S, min(KEEPALIVE_MAX_S, budget / 3))


def accepted(message: str = "") -> Answer:
    """The 202 a delivery gets while its handler goes on."""
    body: dict[str, Any] = {"code": 0, "accepted": True}
    if message:
        body["message"] = message
    return 202, body


def failure(exc: BaseException) -> Answer:
    """A handler's exception as the 500 its attempt is answered (a transient failure)."""
    return 500, {"code": -1, "message": f"{type(exc).__name__}: {exc}"}


def outcome(method: str, value: Any) -> tuple[Answer, bool]:
    """A handler's returned value as its answer, and whether the attempt failed (its value
    is not JSON, so there is nothing to answer)."""
    if value is ACCEPTED:
        return accepted(), False
    reply = envelope.wrap(value)
    try:
        json.dumps(reply, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return (500, {"code": -1, "message": not_json(method, value, exc)}), True
    return (200, reply), False


def not_json(method: str, value: Any, error: BaseException) -> str:
    kind = "coroutine" if inspect.iscoroutine(value) else type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    why = "did you mean async def + await?" if kind == "coroutine" else str(error)
    return f"handler for {method!r} returned {article} {kind}, which is not JSON ({why})"


# -- one delivery, one run -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery admitted to run: what its handler, its answer and its reports need."""

    method: str
    task_id: str
    payload: dict[str, Any]
    attempt_seq: int | None
    trace: dict[str, Any] | None
    session_id: str | None
    arrived: float  # epoch seconds, this host's clock
    deadline: float | None  # epoch seconds, the hub's: when it stops waiting for the answer
    blob: dict[str, Any] | None = None  # the payload_ref: a blob's facts and link (reach.sdk.blobs)

    @classmethod
    def of(cls, method: str, body: Mapping[str, Any], now: float) -> Delivery:
        """From a delivery's body whose ``task_id`` and ``payload`` were checked."""
        seq, trace_, session = (body.get(k) for k in ("attempt_seq", "trace", "session_id"))
        return cls(
            method=method,
            task_id=body["task_id"],
            payload=body.get("payload", {}),
            attempt_seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            trace=trace_ if isinstance(trace_, dict) else None,
            session_id=session if isinstance(session, str) and session else None,
            arrived=now,
            deadline=deadline_of(body),
            blob=ref if isinstance(ref := body.get("payload_ref"), dict) else None,
        )

    @property
    def budget(self) -> float:
        """The time the hub gave this delivery (its deadline less its arrival)."""
        return DEFAULT_BUDGET_S if self.deadline is None else self.deadline - self.arrived


def deadline_of(body: Mapping[str, Any]) -> float | None:
    value = body.get("deadline")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class Run:
    """One handler run: its answer once it ends, and who hears it -- the delivery that
    waits, or (once a delivery was answered 202) the hub, in a report."""

    def __init__(self, delivery: Delivery, on_accept: Callable[[Run], None]) -> None:
        self.delivery = delivery
        self.answer: Answer | None = None
        self.failed = False
        self.ended = threading.Event()
        self._on_accept = on_accept
        self._lock = threading.Lock()
        self._accepted = False
        self._wakers: list[Callable[[], None]] = []

    @property
    def accepted(self) -> bool:
        """Whether a delivery of this run was answered 202 (its outcome is reported)."""
        with self._lock:
            return self._accepted

    def wait(self, timeout: float | None) -> Answer | None:
        """The answer if the handler ends within ``timeout``; else None, and its outcome
        goes to the hub in a report when it ends."""
        self.ended.wait(timeout)
        return self._answer_or_accept()

    async def wait_async(self, timeout: float | None) -> Answer | None:
        """`wait` for an event loop (the handler may run on it, or on a thread)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(_resolve, woken)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

        with self._lock:
            if self.answer is not None:
                return self.answer
            self._wakers.append(wake)
        try:
            await asyncio.wait_for(woken, timeout)
        except TimeoutError:
            pass
        return self._answer_or_accept()

    def _answer_or_accept(self) -> Answer | None:
        with self._lock:
            if self.answer is not None:
                return self.answer
            first = not self._accepted
            self._accepted = True
        if first:
            self._on_accept(self)
        return None

    def _end(self, answer: Answer, failed: bool) -> None:
        with self._lock:
            self.answer, self.failed = answer, failed
            wakers, self._wakers = self._wakers, []
        self.ended.set()
        for wake in wakers:
            wake()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def is_async(handler: Handler) -> bool:
    """Whether ``handler`` is an ``async def`` (or an object whose ``__call__`` is)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (the call method itself, not callable())
    )


# -- the runner -----------------------------------------------------------------------------
class Runner:
    """Runs an agent's handlers within its ``max_concurrency``, and keeps its load figures
    (what heartbeats report)."""

    def __init__(self, agent: Agent, max_concurrency: int, accept_after: float | None) -> None:
        if accept_after is not None and not accept_after >= 0:
            raise ValueError("accept_after must be None or a number of seconds >= 0")
        self.agent = agent
        self.accept_after = accept_after
        self.max_concurrency = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._consecutive_failures = 0
        self._last_duration_ms: float | None = None
        self._runs: dict[str, Run] = {}
        self._tasks: set[Any] = set()  # asyncio tasks and futures: a strong reference each
        self._threads: _Threads | None = None
        self._loop: _LoopThread | None = None

    # -- load ---------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def consecutive_failures(self) -> int:
        with self._lock:
            return self._consecutive_failures

    def load(self) -> dict[str, Any]:
        """The load fields of a heartbeat, as of now."""
        with self._lock:
            return {
                "current_load": self._in_flight / self.max_concurrency,
                "in_flight": self._in_flight,
                "max_concurrency": self.max_concurrency,
                "last_task_duration_ms": self._last_duration_ms,
                "consecutive_failure_count": self._consecutive_failures,
            }

    # -- admission ------------------------------------------------------------------------
    def claim(self) -> bool:
        """Take a slot for a run (False: all ``max_concurrency`` are taken; answer 429)."""
        if not self._slots.acquire(blocking=False):
            return False
        with self._lock:
            self._in_flight += 1
        return True

    def running(self, task_id: str) -> Run | None:
        """The run of ``task_id`` under way here, if any."""
        with self._lock:
            return self._runs.get(task_id)

    def accept_wait(self, body: Mapping[str, Any], now: float | None = None) -> float | None:
        """How long this delivery waits for its handler before it is answered 202."""
        return accept_wait(
            self.accept_after, deadline_of(body), time.time() if now is None else now
        )

    # -- running --------------------------------------------------------------------------
    def start(
        self,
        delivery: Delivery,
        handler: Handler,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Run:
        """Run ``handler`` for ``delivery`` (its slot claimed): an ``async def`` one on
        ``loop`` when given (the caller runs on it), else on the agent's own loop."""
        run = Run(delivery, self._follow_later)
        with self._lock:
            self._runs[delivery.task_id] = run
        if not is_async(handler):
            self._pool().submit(lambda: self._run_sync(run, handler))
        elif loop is not None:
            self._keep(loop.create_task(self._run_async(run, handler, None)))
        else:
            own = self._own_loop()
            coro = self._run_async(run, handler, own)
            self._keep(asyncio.run_coroutine_threadsafe(coro, own.loop))
        return run

    def _keep(self, task: Any) -> None:
        with self._lock:
            self._tasks.add(task)
        task.add_done_callback(self._drop)

    def _drop(self, task: Any) -> None:
        with self._lock:
            self._tasks.discard(task)

    def _run_sync(self, run: Run, handler: Handler) -> None:
        d = run.delivery
        started = time.monotonic()
        answer, failed = failure(RuntimeError("the handler did not return")), True
        try:
            with self._context(d):
                value = handler(d.task_id, d.payload)
            answer, failed = self._outcome(d, value)
        except BusinessError as exc:
            answer, failed = (200, {"code": exc.code, "message": exc.message}), False
        except Exception as exc:
            log.exception("handler for %s failed on task %s", d.method, d.task_id)
            answer = failure(exc)
        finally:
            self._settle(run, answer, failed, started)

    async def _run_async(self, run: Run, handler: Handler, own: _LoopThread | None) -> None:
        d = run.delivery
        started = time.monotonic()
        answer, failed = failure(RuntimeError("the handler did not return")), True
        try:
            with self._context(d):  # inside the coroutine: a task copies its creator's context
                value = handler(d.task_id, d.payload)
                if inspect.isawaitable(value):
                    value = await value
            answer, failed = self._outcome(d, value)
        except BusinessError as exc:
            answer, failed = (200, {"code": exc.code, "message": exc.message}), False
        except asyncio.CancelledError as exc:  # its loop is stopping: a transient failure
            log.warning("handler for %s cancelled on task %s", d.method, d.task_id)
            answer = failure(exc)
        except Exception as exc:
            log.exception("handler for %s failed on task %s", d.method, d.task_id)
            answer = failure(exc)
        finally:
            self._settle(run, answer, failed, started)
            if own is not None:
                own.run_ended()

    @contextmanager
    def _context(self, d: Delivery) -> Iterator[None]:
        """The handler's context: its span (when this process traces) and its trace, hub,
        API key and session, which nested reaches take."""
        agent = self.agent
        delivered = (d.trace or {}).get("traceparent")
        attributes = {
            "reach.task_id": d.task_id,
            "reach.attempt": d.attempt_seq,
            "reach.agent_id": agent.agent_id,
            "reach.instance_id": agent.instance_id,
            "reach.method": d.method,
        }
        with (
            telemetry.span(f"reach.handle {d.method}", delivered, attributes, "server") as tp,
            trace.handling(
                d.task_id,
                d.trace,
                agent.agent_id,
                agent.hub.base_url,
                agent._api_key,
                session_id=d.session_id,
                traceparent=tp if isinstance(tp, str) else None,
                blob=d.blob,
            ),
        ):
            yield

    def _outcome(self, d: Delivery, value: Any) -> tuple[Answer, bool]:
        answer, failed = outcome(d.method, value)
        if failed:
            if inspect.iscoroutine(value) or inspect.isgenerator(value):
                value.close()  # never to be awaited or iterated: say so, not "never awaited"
            log.error("task %s: %s", d.task_id, answer[1]["message"])
        return answer, failed

    def _settle(self, run: Run, answer: Answer, failed: bool, started: float) -> None:
        """The run ended: free its slot, keep its answer (unless it failed: the hub's retry
        runs it again), and give the answer to whoever waits."""
        task_id = run.delivery.task_id
        self.agent.dedup.finish(task_id, answer, remember=not failed)
        with self._lock:
            if self._runs.get(task_id) is run:
                del self._runs[task_id]
            self._in_flight -= 1
            self._last_duration_ms = (time.monotonic() - started) * 1000
            self._consecutive_failures = self._consecutive_failures + 1 if failed else 0
        self._slots.release()
        run._end(answer, failed)

    # -- after a 202 ------------------------------------------------------------------------
    def _follow_later(self, run: Run) -> None:
        threading.Thread(
            target=self._follow,
            args=(run,),
            name=f"reach-report-{run.delivery.task_id}",
            daemon=True,
        ).start()

    def _follow(self, run: Run) -> None:
        """Keep the hub's watchdog off while the handler runs, then report its outcome."""
        every = keepalive_interval(run.delivery.budget)
        while not run.ended.wait(every):
            self._keepalive(run)
        self._report(run)

    def _attempt(self, d: Delivery) -> int | None:
        """The attempt to name: the latest delivered here (a redelivery while the handler
        ran is the one the hub waits on), else the run's own."""
        latest = self.agent.accepted_attempt(d.task_id)
        return latest if latest is not None else d.attempt_seq

    def _keepalive(self, run: Run) -> None:
        d = run.delivery
        seq = self._attempt(d)
        if seq is None:
            return
        try:
            self.agent._post_keepalive(d.task_id, seq)
        except StaleReport as exc:
            log.info("keepalive of task %s: the hub moved on (%s)", d.task_id, exc)
        except HubUnavailable as exc:
            log.warning("keepalive of task %s not sent: %s", d.task_id, exc)
        except ReachError as exc:
            log.warning("hub refused the keepalive of task %s: %s", d.task_id, exc)

    def _report(self, run: Run) -> None:
        d = run.delivery
        assert run.answer is not None
        status, body = run.answer
        if status == 202:
            return  # the handler returned ACCEPTED: it reports for itself
        if run.failed:
            fields: dict[str, Any] = {
                "code": -1,
                "message": str(body.get("message", ""))[:MAX_REPORT_MESSAGE],
                "transient": True,
            }
        elif (code := envelope.code_of(body) or 0) != 0:
            fields = {"code": code, "message": str(body.get("message", ""))[:MAX_REPORT_MESSAGE]}
        else:
            fields = {"data": body.get("data")}
        give_up = time.monotonic() + REPORT_PATIENCE_S
        pause = REPORT_BACKOFF_FIRST_S
        while True:
            seq = self._attempt(d)
            if seq is None:
                log.error(
                    "task %s ended after its 202, but its delivery named no attempt_seq: "
                    "its outcome cannot be reported",
                    d.task_id,
                )
                return
            try:
                self.agent._post_result(d.task_id, seq, **fields)
                return
            except StaleReport as exc:
                log.warning("report of task %s refused, the hub moved on: %s", d.task_id, exc)
                return
            except HubUnavailable as exc:
                if time.monotonic() + pause > give_up:
                    log.error(
                        "report of task %s lost: the hub was unavailable for %.0f s: %s",
                        d.task_id, REPORT_PATIENCE_S, exc,
                    )  # fmt: skip
                    return
                log.warning(
                    "report of task %s waits for the hub (again in %.1f s): %s",
                    d.task_id, pause, exc,
                )  # fmt: skip
                time.sleep(pause)
                pause = min(REPORT_BACKOFF_MAX_S, pause * 2)
            except ReachError as exc:
                log.error("hub refused the report of task %s: %s", d.task_id, exc)
                return

    # -- threads and loop -----------------------------------------------------------------
    def _pool(self) -> _Threads:
        with self._lock:
            if self._threads is None:
                self._threads = _Threads(f"reach-handler-{self.agent.agent_id}")
            return self._threads

    def _own_loop(self) -> _LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread(f"reach-loop-{self.agent.agent_id}")
            self._loop.run_started()
            return self._loop

    def close(self) -> None:
        """Let idle threads and the agent's loop go; handlers still running finish first
        (and report, if they were answered 202). Started again on the next delivery."""
        with self._lock:
            threads, self._threads = self._threads, None
            own, self._loop = self._loop, None
        if threads is not None:
            threads.close()
        if own is not None:
            own.retire()


class _Threads:
    """Daemon threads for ``def`` handlers, started on demand and reused. Their number is
    bounded by the runs in flight (slots) plus the few that are just ending."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # one waiting thread takes this job
            else:
                self._started += 1
                threading.Thread(target=self._work, name=self._name, daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a run settles itself; this would be a bug in the SDK
                log.exception("a handler run failed in the SDK")
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            count = self._started
        for _ in range(count):  # idle threads end now, busy ones after their job
            self._jobs.put(None)


class _LoopThread:
    """The agent's own event loop, in a daemon thread, for ``async def`` handlers of the
    built-in server and the channel. Retired, it stops once its last run ended."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._runs = 0  # runs started on it and not ended
        self._lock = threading.Lock()
        self._retired = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def run_started(self) -> None:
        with self._lock:
            self._runs += 1

    def run_ended(self) -> None:
        with self._lock:
            self._runs -= 1
            stop = self._retired and self._runs == 0
        if stop:
            self.loop.stop()  # on the loop's own thread: it stops after this callback

    def retire(self) -> None:
        with self._lock:
            self._retired = True
            stop = self._runs == 0
        if stop:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


__all__ = [
    "ACCEPTED",
    "DEFAULT_ACCEPT_AFTER_S",
    "Delivery",
    "Run",
    "Runner",
    "accept_wait",
    "keepalive_interval",
    "outcome",
]
