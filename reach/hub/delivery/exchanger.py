"""A worker process's exchanges with agents: many in flight, none holding a slot.

Agents think: an LLM agent takes seconds to minutes per task. A Celery slot that waited
on each exchange would cap the hub at slots ÷ handler time (2 slots and 2 s: one task a
second). Here a slot does only the short steps -- it begins an attempt (claim, route,
sign: ``Pipeline.begin``) and hands the `Dispatch` over -- and this process's event loop
holds the exchange (aiohttp: 0.4 ms of CPU per exchange at 2,000 in flight) for as long
as the agent works, up to the task's timeout. The answer is recorded
(``Pipeline.conclude``) on a few threads of the exchanger's own, and a retry it
schedules is published.

At-least-once holds without the Celery message, which was acked once the slot handed
the attempt over: the attempt's lease in the store does. The exchanger renews the
leases of its exchanges (one statement for all of them, every third of
``exchanges.lease_s``), so a process that dies -- killed, out of memory -- renews nothing,
its leases lapse within ``lease_s`` and the outbox relay's net delivers those attempts
again; an agent's dedup guard answers a redelivered task it already ran with its first
answer. A process stopping on purpose `drain`\\ s: its exchanges get
``exchanges.drain_s`` to end, and the leases of the rest are given back at once.

At most ``exchanges.max_in_flight`` exchanges per process: past it, `hand_over` blocks
the slot until one ends (backpressure onto the broker's queue, not unbounded memory).
And at most an instance's declared ``max_concurrency`` of them at that instance: the
others wait on the loop for a place (no slot, no agent time spent on a 429) for as long
as their exchange's budget, and only then count as the instance's backpressure. Other
processes' exchanges are not counted, so an instance may still answer 429 (busy): the
exchange is sent again from the loop after a short wait while its budget lasts
(`reach.core.delivery.busy`), not deferred through the store and the broker. One that
waited is looked at again before it is sent: a task whose session closed meanwhile is
cancelled unsent, and an instance whose breaker opened meanwhile is not sent to.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import Counter

from reach.core.delivery.answers import AgentAnswer
from reach.core.delivery.busy import resend_after
from reach.core.interop import a2a as a2a_rules
from reach.core.interop.channel import redacted
from reach.core.security.networks import NetworkRule
from reach.errors import HubUnavailable
from reach.hub import logs, tracing
from reach.hub.delivery.claims import renew
from reach.hub.delivery.pipeline import Pipeline
from reach.hub.delivery.routing import Dispatch
from reach.hub.delivery.transports import AgentTransport, Exchanged, ProgressSink
from reach.hub.flow import breakers as breaker_store
from reach.hub.gates import sessions as user_sessions
from reach.hub.ledger.tasks import Publish

log = logging.getLogger("reach.hub.delivery.exchanger")

EXCHANGES_TOTAL = Counter(
    "agentreach_exchanges_total",
    "Agent exchanges started and ended by workers (in flight: started - ended), and sent "
    "again after a busy instance's 429 (resent_busy).",
    ["stage"],
)
CANCELLED = Exchanged(AgentAnswer(None, None, "cancelled before it was sent"), unsent=True)
"""An attempt whose task was cancelled while it waited for a place: nothing was sent."""
RECORD_RETRY_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""An answer the store refused to record is tried again after each of these (the lease
is renewed meanwhile); past them, its lease lapses and the relay's net takes over."""


@dataclass(slots=True)
class _InFlight:
    dispatch: Dispatch
    expires: float  # the hub clock's time its lease runs out, as far as this process knows


class Exchanger:
    """This process's exchanges; `hand_over` from any thread, `drain` when stopping."""

    def __init__(
        self,
        pipeline: Pipeline,
        transport: AgentTransport,
        publish: Callable[[list[Publish]], object],
        *,
        max_in_flight: int = 2000,
        drain_s: float = 5.0,
        record_threads: int = 4,
    ) -> None:
        self.pipeline = pipeline
        self.transport = transport
        self.publish = publish
        self.max_in_flight = max_in_flight
        self.drain_s = drain_s
        self._places = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, int], _InFlight] = {}
        self._idle = threading.Condition(self._lock)
        self._recorder = ThreadPoolExecutor(record_threads, thread_name_prefix="reach-record")
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run
        self._places_at: dict[tuple[str, int], asyncio.Semaphore] = {}  # on the loop only
        self._renewing = False
        self._closing = False
        dpolicy = pipeline.dpolicy
        self.renew_every = dpolicy.lease_s / 3

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- handing over (a worker slot's thread) ------------------------------------------

    def hand_over(self, d: Dispatch) -> None:
        """Take the exchange of a begun attempt; returns at once unless the process
        holds ``max_in_flight`` already (then when a place frees)."""
        self._places.acquire()
        dpolicy = self.pipeline.dpolicy
        lease = d.connect_timeout + min(d.timeout, dpolicy.lease_s) + dpolicy.lease_margin
        with self._lock:
            self._in_flight[(d.task_id, d.attempt_seq)] = _InFlight(d, self.pipeline.now() + lease)
            start_renewer = not self._renewing
            self._renewing = True
        EXCHANGES_TOTAL.labels("started").inc()
        self.transport.loop.call_soon(self._start, d, start_renewer)

    def _start(self, d: Dispatch, start_renewer: bool) -> None:
        """On the loop: the exchange as a task of its own (and the renewer, once)."""
        self._spawn(self._exchange(d))
        if start_renewer:
            self._spawn(self._renew_forever())

    async def _exchange(self, d: Dispatch) -> None:
        logs.bind_task(d.task_id, d.attempt_seq, d.agent_id)  # this asyncio task's lines
        loop = asyncio.get_running_loop()

        async def progress(update: a2a_rules.Progress) -> None:
            await loop.run_in_executor(self._recorder, self.pipeline.record_progress, d, update)

        started = time.perf_counter()
        try:
            exchanged = await self._until_taken(d, progress, started)
        except Exception as exc:  # a transport's bug must not lose the attempt: transient
            log.exception("exchange of %s#%d failed", d.task_id, d.attempt_seq)
            # its kind only: an exception's text may name the agent's address and port
            exchanged = Exchanged(AgentAnswer(None, None, f"unreachable: {type(exc).__name__}"))
        elapsed = time.perf_counter() - started
        if exchanged is CANCELLED:  # ended before it was sent: nothing to record
            tracing.end_attempt(d.span, "cancelled", failed=False)
            self._ended(d)
            return
        try:
            await loop.run_in_executor(self._recorder, self._conclude, d, exchanged, elapsed)
        except RuntimeError:  # the recorder shut down: the process is leaving
            self._ended(d)

    async def _until_taken(self, d: Dispatch, progress: ProgressSink, started: float) -> Exchanged:
        """The exchange, sent again from the loop while the instance answers 429 (busy:
        another process's exchanges fill its slots) and the attempt's budget lasts
        (`reach.core.delivery.busy`); the last answer otherwise. Refused, the task is not
        in the agent's hands: before each resend it is looked at again as one that waited
        for a place is (a closed session cancels it, an opened breaker stops it)."""
        budget, resends = d.timeout, 0
        loop = asyncio.get_running_loop()
        while True:
            exchanged = await self._at_instance(d, progress, time.perf_counter())
            left = budget - (time.perf_counter() - started)
            wait = resend_after(exchanged.answer.status, resends, left, self.pipeline.rng)
            if wait is None or exchanged.unsent:  # the hub's own answer: it stands
                return exchanged
            EXCHANGES_TOTAL.labels("resent_busy").inc()
            await asyncio.sleep(wait)
            again = await loop.run_in_executor(self._recorder, self._before_resend, d)
            if isinstance(again, Exchanged):
                return again
            resends += 1
            d = replace(again, timeout=budget - (time.perf_counter() - started))

    async def _at_instance(self, d: Dispatch, progress: ProgressSink, started: float) -> Exchanged:
        """The exchange, once the instance has a place for it (its ``max_concurrency``
        among this process's exchanges); none within the exchange's budget: the
        instance's backpressure, as if it had answered 429."""
        if d.max_concurrency <= 0:
            return await self.transport.exchange(d, progress)
        key = (d.instance_id, d.max_concurrency)
        places = self._places_at.get(key)
        if places is None:
            places = self._places_at[key] = asyncio.Semaphore(d.max_concurrency)
        queued = places.locked()
        try:
            async with asyncio.timeout(d.timeout):
                await places.acquire()
        except TimeoutError:
            message = f"instance at max_concurrency ({d.max_concurrency}) for {d.timeout:.1f}s"
            return Exchanged(AgentAnswer(429, {"code": 429, "message": message}), unsent=True)
        try:
            if queued:  # routed before it waited: the instance or the task may have moved
                loop = asyncio.get_running_loop()
                held = await loop.run_in_executor(self._recorder, self._held_back, d)
                if held is not None:
                    return held
                d = replace(d, timeout=max(0.05, d.timeout - (time.perf_counter() - started)))
            return await self.transport.exchange(d, progress)
        finally:
            places.release()

    def _before_resend(self, d: Dispatch) -> Exchanged | Dispatch:
        """What a busy-refused exchange comes to instead of a resend (`_held_back`), or the
        dispatch to send again, with a new reach token (the agent saw the last one)."""
        held = self._held_back(d)
        return held if held is not None else self.pipeline.resigned(d)

    def _held_back(self, d: Dispatch) -> Exchanged | None:
        """What an attempt that waited for a place at its instance comes to instead of
        being sent, if anything: its session closed meanwhile (the task is cancelled
        here, and nothing is left to record), or the instance's breaker opened (the
        attempt waits as for backpressure; a trial goes all the same)."""
        now = self.pipeline.now()
        with self.pipeline.db.begin() as session:
            if d.session_id is not None and user_sessions.cancel_if_closed(
                session, d.task_id, d.session_id, now
            ):
                return CANCELLED
            if not d.ticket.trial and breaker_store.open_until(session, d.instance_id, now):
                message = "the instance's breaker opened while the attempt waited for it"
                return Exchanged(AgentAnswer(429, {"code": 429, "message": message}), unsent=True)
        return None

    # -- one POST outside an attempt (a callback) ---------------------------------------

    def hand_over_post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        connect_timeout: float,
        timeout: float,
        then: Callable[[AgentAnswer], object],
        rule: NetworkRule | None = None,
    ) -> None:
        """POST ``body`` from the loop, then call ``then(answer)`` on a recorder thread; a
        place among ``max_in_flight`` is held meanwhile. Nothing here keeps it
        at-least-once: the caller's own claim in the store does (a callback's lease).
        ``rule``: the addresses this POST may go to (a callback's), judged as it connects."""
        self._places.acquire()
        EXCHANGES_TOTAL.labels("started").inc()

        async def post() -> None:
            loop = asyncio.get_running_loop()
            try:
                answer = await self.transport.http.post(
                    url, body, connect_timeout, timeout, headers, rule=rule
                )
                await loop.run_in_executor(self._recorder, then, answer)
            except Exception:  # the caller's claim lapses and its net takes it again
                log.exception("POST to %s not recorded", redacted(url))
            finally:
                self._places.release()
                EXCHANGES_TOTAL.labels("ended").inc()

        self.transport.loop.call_soon(self._spawn, post())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- recording (the exchanger's threads) ----------------------------------------------

    def _conclude(self, d: Dispatch, exchanged: Exchanged, elapsed: float) -> None:
        # a recorder thread: run_in_executor carries no context of the exchange's
        with logs.task_context(d.task_id, d.attempt_seq, d.agent_id):
            try:
                retry = self._record(d, exchanged, elapsed)
                if retry is not None:
                    try:
                        self.publish([retry])
                    except Exception as exc:  # the outbox holds it: the relay publishes it
                        log.warning("retry of %s left to the relay: %s", d.task_id, exc)
            finally:
                self._ended(d)

    def _record(self, d: Dispatch, exchanged: Exchanged, elapsed: float) -> Publish | None:
        for wait in (*RECORD_RETRY_S, None):
            try:
                return self.pipeline.conclude(d, exchanged, elapsed)
            except HubUnavailable as exc:
                if wait is None or self._closing:
                    log.error(
                        "answer of %s#%d not recorded (%s): its lease lapses and the "
                        "relay delivers it again", d.task_id, d.attempt_seq, exc,
                    )  # fmt: skip
                    return None
                log.warning("recording %s#%d: %s; again in %.1fs", d.task_id, d.attempt_seq,
                            exc, wait)  # fmt: skip
                time.sleep(wait)
        return None

    def _ended(self, d: Dispatch) -> None:
        with self._lock:
            if self._in_flight.pop((d.task_id, d.attempt_seq), None) is None:
                return
            self._idle.notify_all()
        self._places.release()
        EXCHANGES_TOTAL.labels("ended").inc()

    # -- leases ---------------------------------------------------------------------------

    async def _renew_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(self.renew_every)
            try:
                await loop.run_in_executor(self._recorder, self.renew_due)
            except RuntimeError:  # the recorder shut down
                return
            except Exception as exc:  # the store down: they are tried again next time
                log.warning("exchange leases not renewed (again in %.0fs): %s",
                            self.renew_every, exc)  # fmt: skip

    def renew_due(self) -> int:
        """Renew the leases that would run out before the next renewal; how many."""
        now = self.pipeline.now()
        soon = now + 2 * self.renew_every
        with self._lock:
            due = [f for f in self._in_flight.values() if f.expires < soon]
        if not due:
            return 0
        until = now + self.pipeline.dpolicy.renewed_lease()
        leases = [(f.dispatch.task_id, f.dispatch.token) for f in due]
        with self.pipeline.db.begin() as session:
            renewed = renew(session, leases, until)
        for f in due:
            f.expires = until
        return renewed

    # -- stopping -------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> int:
        """Let the exchanges in flight end for ``timeout`` (default ``drain_s``) seconds;
        give the leases of those still running back (they lapse now, and the relay
        delivers them again); how many were given back."""
        self._closing = True
        deadline = time.monotonic() + (self.drain_s if timeout is None else timeout)
        with self._lock:
            while self._in_flight and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            left = [(f.dispatch.task_id, f.dispatch.token) for f in self._in_flight.values()]
        if left:
            try:
                with self.pipeline.db.begin() as session:
                    renew(session, left, self.pipeline.now())
                log.warning("gave back %d exchange(s) still in flight", len(left))
            except Exception as exc:  # their leases lapse on their own
                log.warning("%d exchange lease(s) not given back: %s", len(left), exc)
        self._recorder.shutdown(wait=False, cancel_futures=True)
        return len(left)

    def stats(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight}
