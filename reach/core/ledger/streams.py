"""Progress streams' rules, without I/O: event ids, what a stored event streams as, and
what a reconnect's ``Last-Event-ID`` may be.

A task stream's ids are its ``task_events`` ids: monotonic, stored, so a reconnect
replays exactly the events after the one it names. The first event of a fresh stream is
the task's ``state`` (id: the newest event it already reflects); then ``status`` (a
status change), ``progress`` and finally ``result`` (the terminal view), after which the
stream closes. Events that change nothing a caller watches (a refused report, a
duplicate result) are not streamed; their ids are skipped, which a monotonic id allows.

DAG-run and broadcast streams have no event table: their events are the transitions a
run's nodes (a broadcast's targets) went through, ordered by when they happened, and an
event's id is its position in that order (``transitions``). Resuming from position k
replays the transitions after the k-th. A transition recorded with a time earlier than
one already streamed (clocks of different processes) is still streamed live, with the
next id; a replay may then order the two differently, never drop one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_EVENT_ID",
    "STATUS_OF",
    "Transition",
    "broadcast_transitions",
    "dag_transitions",
    "parse_last_event_id",
    "resume_refusal",
    "stream_kind",
]

MAX_EVENT_ID: Final = 2**63 - 1
TERMINAL_KINDS: Final = frozenset({"terminal_success", "terminal_failure"})
STATUS_OF: Final[Mapping[str, str]] = {
    "accepted": "pending",
    "dispatched": "dispatching",
    "ack": "executing",
    "waiting": "waiting",
    "resumed": "executing",
    "retry": "pending",
    "replayed": "pending",
    "approval_requested": "awaiting_approval",
    "approval_granted": "pending",
}
"""The status a task is in right after each status-changing event (``reach.core.ledger.lifecycle``
decides the moves; this only names where each recorded one lands)."""


def stream_kind(event_kind: str) -> str | None:
    """What a stored task event streams as: ``status``, ``progress``, ``result``, or None
    (not streamed)."""
    if event_kind == "progress":
        return "progress"
    if event_kind in TERMINAL_KINDS:
        return "result"
    if event_kind in STATUS_OF:
        return "status"
    return None


def parse_last_event_id(raw: str | None) -> int | None:
    """The id a reconnect names, None for a fresh stream; ValueError when it is not a
    decimal event id (an empty header is a fresh stream, as browsers send it)."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"Last-Event-ID must be a decimal event id, got {raw[:40]!r}")
    if len(text) > 19 or int(text) > MAX_EVENT_ID:
        raise ValueError("Last-Event-ID is out of range")
    return int(text)


def resume_refusal(last: int, newest: int) -> str | None:
    """Why a stream whose newest id is ``newest`` cannot resume after ``last``, or None:
    an id it never sent (newer than its newest) is from another stream or made up."""
    if last > newest:
        return f"Last-Event-ID {last} is newer than this stream's newest event ({newest})"
    return None


@dataclass(frozen=True, slots=True)
class Transition:
    """One step of a node or target: ``key`` reached ``state`` at ``at``."""

    at: float
    index: int  # the node's (target's) position in its run (broadcast)
    rank: int  # running before its ending, for a node that did both at the same time
    key: str
    state: str
    item: Mapping[str, Any]


def _ordered(steps: Iterable[Transition]) -> list[Transition]:
    return sorted(steps, key=lambda t: (t.at, t.index, t.rank))


def dag_transitions(nodes: Sequence[Mapping[str, Any]]) -> list[Transition]:
    """A run's node transitions in order: each node's start (``running``) and ending."""
    steps = []
    for index, node in enumerate(nodes):
        status, started, finished = node["status"], node["started_at"], node["finished_at"]
        if status == "pending":
            continue
        if started is not None:
            steps.append(Transition(started, index, 0, node["node_id"], "running", node))
        if status != "running":
            at = finished if finished is not None else (started or 0.0)
            steps.append(Transition(at, index, 1, node["node_id"], status, node))
    return _ordered(steps)


def broadcast_transitions(
    results: Sequence[Mapping[str, Any]], terminal: Iterable[str]
) -> list[Transition]:
    """A broadcast's answers in order: each target once, when it ended."""
    ends = frozenset(terminal)
    steps = [
        Transition(r["finished_at"] or 0.0, i, 1, str(r["task_id"]), str(r["status"]), r)
        for i, r in enumerate(results)
        if r["status"] in ends
    ]
    return _ordered(steps)
