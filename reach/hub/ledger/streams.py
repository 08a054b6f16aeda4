"""Progress streams (server-sent events) of tasks, DAG runs and broadcasts.

Many streams may watch one task: they share one `Feed` per watched thing in the API
process, which reads the store once per wake-up (a change notice on the completion bus,
``reach.hub.ledger.wakeups.Waiters.on_change``, or its fallback timer) and hands what it read
to every stream of it. A stream costs one read when it opens (the authorisation and the
first state), never one per event. ``agentreach_stream_reads_total`` counts the feeds'
reads.

What each stream sends, and its ids, is ``reach.core.ledger.streams``' rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from reach.core.ledger import streams as rules
from reach.core.ledger.statuses import TERMINAL, DagRunStatus
from reach.errors import BadLastEventId
from reach.hub.ledger.tasks import task_view
from reach.hub.ledger.wakeups import Waiters
from reach.hub.storage.models import TaskEventRow, TaskRow

if TYPE_CHECKING:
    from reach.hub.context import HubContext

log = logging.getLogger("reach.hub.ledger.streams")

STREAM_READS_TOTAL = Counter(
    "agentreach_stream_reads_total", "Store reads by progress-stream feeds.", ["kind"]
)
LIVE_FALLBACK_S = 5.0  # with a live bus, the timer is only a safety net
POLL_S = (0.1, 1.0)  # without one it is the mechanism: from 100 ms, growing to 1 s
SETTLE_S = 0.3  # a DAG's node state lands a moment after its task's notice: read again


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: ``kind`` (the SSE ``event:``), ``data`` and its ``id``."""

    id: int
    kind: str
    data: dict[str, Any]


# -- reads (in a thread: the store is synchronous) -----------------------------------------


def newest_event_id(ctx: HubContext, task_id: str) -> int:
    with ctx.reading() as session:
        newest = session.scalar(
            select(func.max(TaskEventRow.id)).where(TaskEventRow.task_id == task_id)
        )
        return int(newest or 0)


def read_task_events(ctx: HubContext, task_id: str, after: int) -> tuple[list[Event], int]:
    """The streamed events of ``task_id`` after id ``after``, and the newest id read."""
    STREAM_READS_TOTAL.labels("task").inc()
    with ctx.reading() as session:
        rows = session.execute(
            select(
                TaskEventRow.id,
                TaskEventRow.kind,
                TaskEventRow.detail,
                TaskEventRow.at,
                TaskEventRow.attempt_seq,
                TaskEventRow.instance_id,
            )
            .where(TaskEventRow.task_id == task_id, TaskEventRow.id > after)
            .order_by(TaskEventRow.id)
        ).all()
        events: list[Event] = []
        final: dict[str, Any] | None = None
        for row in rows:
            kind = rules.stream_kind(row.kind)
            if kind is None:
                continue
            if kind == "result":
                if final is None:
                    task = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
                    final = task_view(task) if task is not None else {"task_id": task_id}
                events.append(Event(row.id, kind, final))
            elif kind == "progress":
                detail = dict(row.detail or {})
                events.append(
                    Event(
                        row.id,
                        kind,
                        {
                            "task_id": task_id,
                            "progress": detail.get("progress"),
                            "message": detail.get("message", ""),
                            "data": detail.get("data"),
                            "at": row.at,
                            "attempt_seq": row.attempt_seq,
                        },
                    )
                )
            else:
                events.append(
                    Event(
                        row.id,
                        kind,
                        {
                            "task_id": task_id,
                            "status": rules.STATUS_OF[row.kind],
                            "event": row.kind,
                            "at": row.at,
                            "attempt_seq": row.attempt_seq,
                            "instance_id": row.instance_id,
                        },
                    )
                )
        newest = rows[-1].id if rows else after
        return events, int(newest)


# -- shared feeds ----------------------------------------------------------------------------


@dataclass(eq=False)
class Feed:
    """What one watched thing has shown so far, shared by all streams of it."""

    key: str
    items: list[Any] = field(default_factory=list)  # task: Event; DAG/broadcast: views
    cursor: int = 0  # task: the newest event id read
    version: int = 0
    ready: bool = False
    error: BaseException | None = None
    streams: int = 0
    _kick: asyncio.Event = field(default_factory=asyncio.Event)
    _updated: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None

    def kick(self, _key: str = "") -> None:
        self._kick.set()

    async def next_update(self, version: int) -> None:
        """Return once the feed has moved past ``version`` (or failed)."""
        while self.version <= version and self.error is None:
            updated = self._updated
            await updated.wait()

    def publish(self) -> None:
        self.version += 1
        updated, self._updated = self._updated, asyncio.Event()
        updated.set()


class StreamHub:
    """The API process's feeds: one per watched task, run or broadcast while streamed."""

    def __init__(self, ctx: HubContext, waiters: Waiters | None) -> None:
        self.ctx = ctx
        self.waiters = waiters
        self._feeds: dict[str, Feed] = {}

    def _live(self) -> bool:
        """Change notices reach this API (see `reach.hub.ledger.wakeups`): the timer is a net."""
        return self.waiters is not None and self.waiters.changes_live

    @contextlib.asynccontextmanager
    async def join(
        self,
        key: str,
        refresh: Callable[[Feed], Any],
        wake_keys: Callable[[Feed], Iterable[str]],
        settle: bool = False,
    ) -> AsyncIterator[Feed]:
        """The feed of ``key`` (started by its first stream, stopped after its last)."""
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = Feed(key)
            feed.runner = asyncio.create_task(self._run(feed, refresh, wake_keys, settle))
        feed.streams += 1
        try:
            yield feed
        finally:
            feed.streams -= 1
            if feed.streams == 0 and self._feeds.get(key) is feed:
                del self._feeds[key]
                if feed.runner is not None:
                    feed.runner.cancel()

    async def _run(
        self,
        feed: Feed,
        refresh: Callable[[Feed], Any],
        wake_keys: Callable[[Feed], Iterable[str]],
        settle: bool,
    ) -> None:
        pause = POLL_S[0]
        watched: list[str] = []
        stack = contextlib.ExitStack()
        try:
            while True:
                keys = sorted(set(wake_keys(feed)))
                if self.waiters is not None and keys != watched:
                    stack.close()
                    stack = contextlib.ExitStack()
                    stack.enter_context(self.waiters.on_change(keys, feed.kick))
                    watched = keys
                feed._kick.clear()  # before the read: a notice during it is not lost
                try:
                    changed = await run_in_threadpool(refresh, feed)
                except Exception as exc:
                    if not feed.ready:
                        feed.error = exc
                        feed.publish()
                        return
                    log.warning("stream feed %s: read failed: %s", feed.key, exc)
                    changed = False
                if changed or not feed.ready:
                    feed.ready = True
                    feed.publish()
                    pause = POLL_S[0]
                step = LIVE_FALLBACK_S if self._live() else pause
                if settle:  # a DAG's node states are written by its own steps, unannounced
                    step = min(step, POLL_S[1])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(feed._kick.wait(), step)
                    if settle:  # the node state lands a moment after its task's notice
                        await asyncio.sleep(SETTLE_S)
                pause = min(pause * 1.5, POLL_S[1])
        except asyncio.CancelledError:
            pass
        finally:
            stack.close()


# -- the three streams -------------------------------------------------------------------------


def newest_of(
    view: dict[str, Any],
    steps: Callable[[dict[str, Any]], list[rules.Transition]],
    done: Callable[[dict[str, Any]], bool],
) -> int:
    """A DAG run's or broadcast's newest id: its transitions, and its end once done."""
    return len(steps(view)) + (1 if done(view) else 0)


def check_resume(last: int | None, newest: int) -> None:
    """400 ``bad-last-event-id`` for a resume after an id the stream never sent."""
    if last is not None and (refusal := rules.resume_refusal(last, newest)) is not None:
        raise BadLastEventId(refusal, last_event_id=last, newest=newest)


def parse_last_event_id(raw: str | None) -> int | None:
    try:
        return rules.parse_last_event_id(raw)
    except ValueError as exc:
        raise BadLastEventId(str(exc)) from None


async def task_stream(
    hub: StreamHub, task_id: str, view: dict[str, Any], newest: int, last: int | None
) -> AsyncIterator[Event]:
    """A task's stream (``view`` and ``newest`` read when it was authorised)."""
    check_resume(last, newest)
    if last is None:
        yield Event(newest, "state", view)
        if view["status"] in TERMINAL:
            return
        cursor = newest
    else:
        cursor = last

    def refresh(feed: Feed) -> bool:
        events, feed.cursor = read_task_events(hub.ctx, task_id, feed.cursor)
        feed.items.extend(events)
        return bool(events)

    async with hub.join("task:" + task_id, refresh, lambda f: [task_id]) as feed:
        version = 0  # the feed publishes version 1 with its first read
        while True:
            await feed.next_update(version)
            if feed.error is not None:
                raise feed.error
            version = feed.version
            for event in feed.items:
                if event.id > cursor:
                    yield event
                    cursor = event.id
                    if event.kind == "result":
                        return
            if any(e.kind == "result" for e in feed.items):
                return  # resumed after the result: nothing more will come


async def snapshot_stream(
    hub: StreamHub,
    key: str,
    read: Callable[[], dict[str, Any]],
    first: dict[str, Any],
    steps: Callable[[dict[str, Any]], list[rules.Transition]],
    done: Callable[[dict[str, Any]], bool],
    wake_keys: Callable[[dict[str, Any]], Iterable[str]],
    item_kind: str,
    end_kind: str,
    last: int | None,
    settle: bool = False,
) -> AsyncIterator[Event]:
    """A DAG run's or broadcast's stream: ``state`` first, then one ``item_kind`` event
    per transition, then ``end_kind`` with the final view (ids: ``reach.core.ledger.streams``)."""
    transitions = steps(first)
    newest = newest_of(first, steps, done)
    check_resume(last, newest)
    emitted: set[tuple[str, str]] = set()
    if last is None:
        yield Event(len(transitions), "state", first)
        if done(first):
            return
        emitted = {(t.key, t.state) for t in transitions}
        last_id = len(transitions)
    else:
        emitted = {(t.key, t.state) for t in transitions[:last]}
        last_id = last
        if last == newest and done(first):
            return

    def refresh(feed: Feed) -> bool:
        STREAM_READS_TOTAL.labels(key.split(":", 1)[0]).inc()
        view = read()
        if feed.items and feed.items[-1] == view:
            return False
        feed.items[:] = [view]
        return True

    def keys(feed: Feed) -> Iterable[str]:
        return wake_keys(feed.items[-1] if feed.items else first)

    async with hub.join(key, refresh, keys, settle=settle) as feed:
        version = 0  # the feed publishes version 1 with its first read
        while True:
            await feed.next_update(version)
            if feed.error is not None:
                raise feed.error
            version = feed.version
            view = feed.items[-1]
            for position, step in enumerate(steps(view), start=1):
                if (step.key, step.state) in emitted:
                    continue
                emitted.add((step.key, step.state))
                last_id = max(last_id + 1, position)
                yield Event(last_id, item_kind, {**step.item, "state": step.state})
            if done(view):
                yield Event(last_id + 1, end_kind, view)
                return


def dag_done(view: dict[str, Any]) -> bool:
    return bool(view["status"] != DagRunStatus.RUNNING)


def dag_steps(view: dict[str, Any]) -> list[rules.Transition]:
    return rules.dag_transitions(view["nodes"])


def dag_wake_keys(view: dict[str, Any]) -> list[str]:
    return [n["task_id"] for n in view["nodes"] if n.get("task_id")]


def broadcast_steps(view: dict[str, Any]) -> list[rules.Transition]:
    return rules.broadcast_transitions(view["results"], TERMINAL)


def broadcast_done(view: dict[str, Any]) -> bool:
    return bool(view["complete"])


def broadcast_wake_keys(view: dict[str, Any]) -> list[str]:
    return [r["task_id"] for r in view["results"]]
