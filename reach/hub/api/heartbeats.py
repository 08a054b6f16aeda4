"""The API's intake of agent heartbeats: quiet ones buffered and written in one batch.

A fleet of idle instances costs the hub one transaction per heartbeat if each is written
as it comes. Here a beat that can only confirm what is known (`reach.core.fleet.coalescing`)
is answered from this process's view of its instance and kept until the next flush, at
most ``heartbeat.flush_s`` later, which writes every buffered beat in one transaction
(`reach.hub.fleet.registry.heartbeats`). Any other beat is written at once, as before.

At least once, at most one flush late: a beat buffered when the API process dies is lost,
which to the hub looks like one missed heartbeat; an instance is only offline after
``missed_intervals`` of them. A flush that fails (database unavailable) keeps its beats
for the next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cachetools import LRUCache
from sqlalchemy.orm import Session

from reach.core.fleet.coalescing import Known, Quiet, may_defer
from reach.hub import metrics
from reach.hub.context import HubContext
from reach.hub.fleet import registry
from reach.hub.gates import sessions
from reach.wire.schemas import HeartbeatRequest

log = logging.getLogger("reach.hub.api.heartbeats")

# instances this process keeps a view of: past it the least recent is forgotten (its next
# beat is written at once), so instances that never come back do not pile up
KNOWN_MAX = 100_000

Taken = tuple[registry.Beat, dict[str, str]]  # the answer and its headers


class HeartbeatIntake:
    """One per API process; ``flush_s`` 0 writes every beat at once (no buffer)."""

    def __init__(self, ctx: HubContext, flush_s: float) -> None:
        self._ctx, self._flush_s = ctx, flush_s
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[HeartbeatRequest, float]] = {}
        self._known: LRUCache[str, Known] = LRUCache(maxsize=KNOWN_MAX)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, hb: HeartbeatRequest) -> Taken:
        """Record (or buffer) one heartbeat; raises `UnknownInstance` as the registry does."""
        return self.buffered(hb) or self.write(hb)

    def buffered(self, hb: HeartbeatRequest) -> Taken | None:
        """The answer to a quiet beat, kept for the next flush; None when it must be
        written (`write`). No I/O, only this process's memory: the API answers it on its
        event loop, without a worker thread."""
        now = self._ctx.clock.now()
        quiet = Quiet(hb.agent_id, hb.in_flight, hb.consecutive_failure_count)
        with self._lock:
            known = self._known.get(hb.instance_id)
            threshold = self._ctx.policy.reach.routing_failure_threshold
            if self._flush_s > 0 and may_defer(
                known,
                quiet,
                now,
                max_age=known.interval if known else 0.0,
                failure_threshold=threshold,
            ):
                assert known is not None
                self._pending[hb.instance_id] = (hb, now)  # the newest one wins
                self._start()
                metrics.HEARTBEATS_TOTAL.inc()
                return registry.Beat(known.status, known.interval, known.alerted), {}
            # written now: an older buffered beat of it must not land after this one
            self._pending.pop(hb.instance_id, None)
        return None

    def write(self, hb: HeartbeatRequest) -> Taken:
        """Write one heartbeat at once (a transaction: call it off the event loop)."""
        now = self._ctx.clock.now()
        taken = self._ctx.write(self._writer(hb, now))
        metrics.HEARTBEATS_TOTAL.inc()
        self._learn({hb.instance_id: taken[0]}, {hb.instance_id: hb.agent_id}, now)
        return taken

    def _writer(self, hb: HeartbeatRequest, now: float) -> Callable[[Session], Taken]:
        def work(session: Session) -> Taken:
            beat = registry.heartbeat(session, hb, now, self._ctx.policy)
            header = sessions.closed_header(session, hb.agent_id, hb.instance_id, now)
            return beat, header

        return work

    def flush(self) -> int:
        """Write the buffered beats in one transaction; how many there were."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        beats = list(batch.values())
        try:
            written = self._ctx.write(lambda s: registry.heartbeats(s, beats, self._ctx.policy))
        except Exception:
            log.exception(
                "writing %d buffered heartbeats failed; kept for the next flush", len(beats)
            )
            with self._lock:
                for iid, beat in batch.items():
                    self._pending.setdefault(iid, beat)
            return 0
        self._learn(
            written, {iid: hb.agent_id for iid, (hb, _) in batch.items()}, self._ctx.clock.now()
        )
        return len(beats)

    def _learn(
        self, beats: dict[str, registry.Beat | None], agents: dict[str, str], now: float
    ) -> None:
        with self._lock:
            for iid, beat in beats.items():
                if beat is None:
                    self._known.pop(iid, None)
                else:
                    self._known[iid] = Known(
                        agents[iid], beat.status, beat.alerted, beat.heartbeat_interval, now
                    )

    def registered(self, instance_id: str, agent_id: str, status: str, interval: float) -> None:
        """A new instance registered here: its first beats may wait too (it has no alerts)."""
        now = self._ctx.clock.now()
        with self._lock:
            self._known[instance_id] = Known(agent_id, status, False, interval, now)

    def forget(self, instance_id: str) -> None:
        """Drop this process's view of an instance (it deregistered here)."""
        with self._lock:
            self._known.pop(instance_id, None)
            self._pending.pop(instance_id, None)

    def _start(self) -> None:
        """Start the flusher with the first buffered beat (called under the lock)."""
        if self._thread is None:
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._flush_forever, name="reach-heartbeats", daemon=True
            )
            self._thread.start()

    def _flush_forever(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()

    def stop(self) -> None:
        """Stop the flusher and write what is buffered (the API shuts down)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(timeout=10)
        self.flush()
