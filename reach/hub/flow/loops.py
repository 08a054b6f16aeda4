"""Loop detection and the dependency-entropy alert at submit (the I/O around
`reach.core.flow.loops`).

**Whose trace counts.** A handler may drop its trace (clear the SDK's context, post raw
HTTP) or forge one (a fresh root, an empty path); the path the loop check reads is
therefore derived by the hub, not taken from the request:

1. A request that names a ``parent_task_id`` of an existing task continues that task's
   *stored* trace: its root, its hops + 1, its path + the agent it was delivered to
   (`reach.core.flow.loops.child_trace`). What the request says of path and hops is ignored.
2. When the caller is an agent (``agent:<id>``: an agent key, or a handler sending as its
   agent) and the request names no parent, or a parent that is not that agent's task, the
   hub adopts the agent's live task -- the most recent one dispatching or executing at
   that agent -- as the parent, if it has one: a reach an agent sends while handling a
   task is that task's child, whatever it claims. An agent with no live task sends from
   the edge (a new root), and so does a foreign parent it names.
3. Any other caller (a caller key, an admin, the anonymous principal of an open hub)
   without a known parent keeps the trace it sent, or starts a root. On an open hub a
   handler's nested reach is known by the trace the SDK sends (rule 1 still applies):
   without authentication nothing tells the hub which agent is asking.

The derived trace is stored on the task, so the chain continues from the hub's version.
One indexed read of the parent (by task id) or of the agent's live task (by
``(agent_id, status)``); a caller that is not an agent and sends no parent costs none.

**The dependency-entropy alert.** Every reach from an agent is counted per ordered pair,
by the agent it resolved to: a named agent at submit; an intent's match right after the
submit commits; tags or a capability once delivery routed the first attempt (the worker
counts it). They are counted in hub-wide windows (`SharedCounts`, name ``link``, key
``src>dst``, over ``router.loop_alert_window``). When both directions exceed
``router.loop_alert_threshold`` the link is suspected of a dependency loop: an
``agent_links`` row each way (demoted until a window after the last busy reach; a reach
resolved after its submit stays as it was queued), an audit entry
``dependency_loop_suspected``, the ``agentreach_dependency_loop_suspected_total`` metric,
a WARNING log; reaches on the link are then stored with priority ``background``. When the
counts fall back, the next reach on the link lifts the demotion (audit
``dependency_loop_calmed``, a log); without traffic it lapses at ``demoted_until``. Per
submit: one buffered add and a cached total; the reverse total and the link rows are read
only when the forward direction is busy (or the link is known demoted).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.flow import loops
from reach.core.flow.loops import LinkCounts, LinkVerdict
from reach.core.ledger.statuses import TaskStatus
from reach.core.security.auth import HUB
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.metrics import DEPENDENCY_LOOP_SUSPECTED_TOTAL
from reach.hub.security import audit, trust
from reach.hub.settings import RouterSettings
from reach.hub.storage.models import AgentLinkRow, TaskRow
from reach.wire.schemas import SubmitRequest

log = logging.getLogger("reach.hub.flow.loops")

COUNTS = "link"  # the SharedCounts name of the per-pair reach counts
Transact = Callable[[Callable[[Session], Any]], Any]  # runs a function in a transaction
_HANDLING = (TaskStatus.DISPATCHING, TaskStatus.EXECUTING)


def derive_trace(
    session: Session, req: SubmitRequest, task_id: str, caller: str | None
) -> dict[str, Any]:
    """The trace the new task ``task_id`` is stored with (rules in the module docstring)."""
    sent = req.trace.model_dump() if req.trace else None
    agent = trust.agent_of(caller)
    parent = None
    parent_id = sent.get("parent_task_id") if sent else None
    if parent_id:
        parent = _task(session, TaskRow.task_id == parent_id)
    if agent is not None and (parent is None or parent.agent_id != agent):
        parent = _task(
            session,
            TaskRow.agent_id == agent,
            TaskRow.status.in_(_HANDLING),
            latest=True,
        )
        if parent is None:
            return loops.edge_trace(task_id)
    if parent is not None:
        return loops.child_trace(parent.task_id, parent.trace, parent.agent_id)
    return sent if sent else loops.edge_trace(task_id)


def check(trace: dict[str, Any], targets: Sequence[str], max_hops: int) -> list[str]:
    """`reach.core.flow.loops.check` on a derived trace: the eligible agents off its path."""
    path = [str(a) for a in trace.get("path") or []]
    return loops.check(path, int(trace.get("hops") or 0), targets, max_hops)


def _task(session: Session, *where: Any, latest: bool = False) -> Any:
    stmt = select(TaskRow.task_id, TaskRow.agent_id, TaskRow.trace).where(*where)
    if latest:
        stmt = stmt.order_by(TaskRow.updated_at.desc(), TaskRow.id.desc())
    return session.execute(stmt.limit(1)).first()


# -- the dependency-entropy alert ------------------------------------------------------


@dataclass
class LinkWatch:
    """One process's watch over agent links (shared counts; the links it knows demoted)."""

    counts: SharedCounts
    threshold: int
    window_s: float
    _demoted: dict[tuple[str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def look(self, src: str, dst: str, now: float) -> LinkCounts | None:
        """The link's counts with one more reach ``src`` -> ``dst``, or None while it is
        quiet (the common case: one cached total). Read *before* the submit's transaction:
        the shared counts have their own, which SQLite would make wait on the open one."""
        ahead = self.counts.total(COUNTS, f"{src}>{dst}", now, self.window_s) + 1
        with self._lock:
            known = (src, dst) in self._demoted
        if ahead <= self.threshold and not known:
            return None
        back = self.counts.total(COUNTS, f"{dst}>{src}", now, self.window_s)
        if back <= self.threshold and not known:
            return None  # busy one way only: a dependency, not a loop
        return LinkCounts(ahead, back)

    def settle(self, session: Session, src: str, dst: str, counts: LinkCounts, now: float) -> bool:
        """Update a busy (or known demoted) link's rows in ``session``'s transaction;
        whether this reach is demoted to background."""
        row = session.get(AgentLinkRow, (src, dst))
        until = row.demoted_until if row is not None else None
        verdict = loops.judge_link(counts, self.threshold, _suspected(row))
        ahead, back = counts.forward, counts.backward
        if verdict is LinkVerdict.SUSPECTED:
            self._suspect(session, src, dst, ahead, back, now)
            return True
        if verdict is LinkVerdict.HOT:
            if until is None or until - now < self.window_s / 2:  # renew, not per reach
                renewed = {
                    **(row.detail if row is not None and row.detail else {}),
                    "renewed_at": now,
                }
                self._set(session, src, dst, now + self.window_s, renewed)
            self._remember(src, dst, now + self.window_s)
            return True
        if verdict is LinkVerdict.CALMED:
            self._calm(session, src, dst, ahead, back, now)
        else:
            self._forget(src, dst)
        return False

    def count(self, src: str, dst: str, now: float) -> None:
        """Count one accepted reach ``src`` -> ``dst`` (after its transaction committed)."""
        self.counts.add(COUNTS, f"{src}>{dst}", now)

    def resolved(self, run: Transact, src: str | None, dst: str | None, now: float) -> None:
        """A reach that named no agent, once it resolved to ``dst`` (an intent matched,
        tags or a capability routed): counted like a named one, and its link settled in
        a transaction of its own when busy (the demotion applies to the reaches after
        it). Called outside any transaction, as `look` must be."""
        if not src or not dst or src == dst:
            return
        seen = self.look(src, dst, now)
        self.count(src, dst, now)
        if seen is not None:
            run(lambda session: self.settle(session, src, dst, seen, now))

    def _suspect(
        self, session: Session, src: str, dst: str, ahead: int, back: int, now: float
    ) -> None:
        until = now + self.window_s
        detail = {
            "state": "suspected",
            "counts": {f"{src}>{dst}": ahead, f"{dst}>{src}": back},
            "threshold": self.threshold,
            "window_s": self.window_s,
        }
        self._set(session, src, dst, until, detail, suspected_at=now)
        audit.record(
            session,
            actor=HUB,
            action="dependency_loop_suspected",
            outcome="suspected",
            now=now,
            target=_link_name(src, dst),
            detail=detail,
        )
        DEPENDENCY_LOOP_SUSPECTED_TOTAL.inc()
        log.warning(
            "dependency_loop_suspected: %s (%d reaches %s->%s, %d back, threshold %d in %gs);"
            " reaches on this link are demoted to background",
            _link_name(src, dst), ahead, src, dst, back, self.threshold, self.window_s,
        )  # fmt: skip
        self._remember(src, dst, until)

    def _calm(
        self, session: Session, src: str, dst: str, ahead: int, back: int, now: float
    ) -> None:
        detail = {
            "state": "calmed",
            "calmed_at": now,
            "counts": {f"{src}>{dst}": ahead, f"{dst}>{src}": back},
            "threshold": self.threshold,
            "window_s": self.window_s,
        }
        self._set(session, src, dst, None, detail)
        audit.record(
            session,
            actor=HUB,
            action="dependency_loop_calmed",
            outcome="calmed",
            now=now,
            target=_link_name(src, dst),
            detail=detail,
        )
        log.warning("dependency loop calmed: %s; its demotion is lifted", _link_name(src, dst))
        self._forget(src, dst)

    def _set(
        self,
        session: Session,
        src: str,
        dst: str,
        until: float | None,
        detail: dict[str, Any],
        suspected_at: float | None = None,
    ) -> None:
        """Both ordered rows of the link: one state for the pair."""
        for a, b in ((src, dst), (dst, src)):
            row = session.get(AgentLinkRow, (a, b))
            if row is None:
                row = AgentLinkRow(src=a, dst=b)
                session.add(row)
            if suspected_at is not None:
                row.suspected_at = suspected_at
            row.demoted_until = until
            row.detail = detail

    def _remember(self, src: str, dst: str, until: float) -> None:
        with self._lock:
            if len(self._demoted) > 10_000:
                self._demoted.clear()
            self._demoted[(src, dst)] = self._demoted[(dst, src)] = until

    def _forget(self, src: str, dst: str) -> None:
        with self._lock:
            self._demoted.pop((src, dst), None)
            self._demoted.pop((dst, src), None)


def _suspected(row: AgentLinkRow | None) -> bool:
    """Alerted and not calmed since (its demotion may have lapsed without traffic)."""
    return row is not None and (row.detail or {}).get("state") == "suspected"


def _link_name(src: str, dst: str) -> str:
    a, b = sorted((src, dst))
    return f"{a}<->{b}"


def caller_agent(caller: str | None, trace: dict[str, Any]) -> str | None:
    """The agent a reach comes from: the authenticated one, else (an open hub) the last
    agent of its derived path."""
    agent = trust.agent_of(caller)
    if agent is not None:
        return agent
    path = trace.get("path") or []
    return str(path[-1]) if path else None


@dataclass(frozen=True)
class LoopGuard:
    """What submit needs for loop checks and link watching: one per API process, and
    one per reach (`for_reach`) carrying its link's counts read before the transaction."""

    max_hops: int
    links: LinkWatch | None = None
    src: str | None = None  # this reach's caller agent and named target agent
    dst: str | None = None
    seen: LinkCounts | None = None

    @classmethod
    def of(cls, router: RouterSettings, counts: SharedCounts | None) -> LoopGuard:
        """From the ``router`` settings; ``counts`` None: no link watch."""
        links = None
        if counts is not None:
            links = LinkWatch(counts, router.loop_alert_threshold, router.loop_alert_window)
        return cls(router.max_hops, links)

    def for_reach(self, caller: str | None, req: SubmitRequest, now: float) -> LoopGuard:
        """This guard for one reach (outside any transaction): from the caller agent (the
        authenticated one, else the last agent of the path it sent) to the agent it names;
        a reach naming none keeps its caller agent for `resolved`."""
        sent = req.trace.model_dump() if req.trace else {}
        src, dst = caller_agent(caller, sent), req.agent_id
        if self.links is None or not src:
            return self
        if not dst or src == dst:
            return replace(self, src=src)
        return replace(self, src=src, dst=dst, seen=self.links.look(src, dst, now))

    def resolved(self, run: Transact, dst: str | None, now: float) -> None:
        """This reach named no agent and the submit resolved it to ``dst`` (an intent's
        match): count it by that agent (`LinkWatch.resolved`)."""
        if self.links is not None and self.dst is None:
            self.links.resolved(run, self.src, dst, now)

    def trace_for(
        self,
        session: Session,
        req: SubmitRequest,
        task_id: str,
        caller: str | None,
        eligible: Sequence[str],
    ) -> dict[str, Any]:
        """The derived trace of the new task, after the loop check passed (raises
        `LoopDetected` when every eligible agent is on its path, or it is too deep)."""
        trace = derive_trace(session, req, task_id, caller)
        check(trace, eligible, self.max_hops)
        return trace

    def observe(
        self,
        session: Session,
        caller: str | None,
        trace: dict[str, Any],
        dst: str | None,
        now: float,
    ) -> bool:
        """Settle this reach's link (a busy one only) in the submit's transaction;
        whether the reach goes to the background queue."""
        if self.links is None or self.seen is None or self.src is None or self.dst is None:
            return False
        if (caller_agent(caller, trace), dst) != (self.src, self.dst):
            return False  # the hub's own trace names another caller: not the link looked at
        return self.links.settle(session, self.src, self.dst, self.seen, now)

    def counted(self, now: float) -> None:
        """Count this reach on its link, once its task is committed."""
        if self.links is not None and self.src is not None and self.dst is not None:
            self.links.count(self.src, self.dst, now)


def list_links(session: Session, now: float) -> list[dict[str, Any]]:
    """The links ever suspected, each ordered pair once, the demoted ones first."""
    rows = session.scalars(select(AgentLinkRow).order_by(AgentLinkRow.src, AgentLinkRow.dst))
    seen: set[tuple[str, str]] = set()
    views: list[dict[str, Any]] = []
    for row in rows:
        pair = tuple(sorted((row.src, row.dst)))
        if pair in seen:
            continue
        seen.add((pair[0], pair[1]))
        demoted = _suspected(row) and row.demoted_until is not None and row.demoted_until > now
        views.append(
            {
                "link": _link_name(row.src, row.dst),
                "agents": list(pair),
                "state": "suspected" if demoted else "calm",
                "suspected_at": row.suspected_at,
                "demoted_until": row.demoted_until if demoted else None,
                "detail": row.detail or {},
            }
        )
    views.sort(key=lambda v: (v["state"] != "suspected", v["link"]))
    return views
