"""The task lifecycle as a transition table, and the one function that applies it.

Delivery, the outbox's nets (lapsed leases, the watchdog) and the dead-letter replay all
ask `transition` for the status they write, so a move the table does not list cannot be
written by any of them. The hot path's prebuilt SQL cannot call a function per row;
it derives its ``WHERE status IN (...)`` guards from `sources_of` and writes
`target_of`, so the statement and the table cannot drift apart.

    pending ──claim──▶ dispatching ──accept──▶ executing
       ▲                 │  ▲ reclaim (lease lapsed)   │
       └──────retry──────┴──┴─────────retry────────────┘
    pending | dispatching | executing ──succeed / fail / dead_letter / cancel──▶ terminal
    awaiting_approval ──approve──▶ pending;  ──reject──▶ failed;  ──cancel──▶ cancelled
    dispatching | executing ──wait──▶ waiting ──resume──▶ executing   (an A2A agent's
    input-required / auth-required state, and its leaving it)
    dead ──replay──▶ pending

Conditions beyond the status (the claim's ``attempt_seq``, the lease token, "first
terminal result wins") stay with the callers: this table says which moves exist at all.
Nothing parks a task in ``awaiting_approval`` or cancels one yet; their moves are listed
so the approval gate and session liveness have a place to land.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from reach.core.ledger.statuses import LIVE, TaskStatus
from reach.errors import IllegalTransition

__all__ = ["TRANSITIONS", "TaskEvent", "ending", "sources_of", "target_of", "transition"]


class TaskEvent(StrEnum):
    """What happens to a task (a move in the lifecycle, not a row of its audit trail)."""

    CLAIM = "claim"  # a worker takes the pending attempt's dispatch lease
    RECLAIM = "reclaim"  # a worker takes a lapsed lease over (the holder died)
    ACCEPT = "accept"  # the agent answered 202: the result comes later
    RETRY = "retry"  # a new attempt is queued (transient failure, backpressure, lost worker)
    SUCCEED = "succeed"
    FAIL = "fail"  # a business error: never retried blindly
    DEAD_LETTER = "dead_letter"  # retries or redeliveries exhausted
    CANCEL = "cancel"
    APPROVE = "approve"
    REJECT = "reject"
    REPLAY = "replay"  # an operator gives a dead task a fresh attempt
    WAIT = "wait"  # an A2A agent needs input or authorisation before it goes on
    RESUME = "resume"  # ... and went on working


_S = TaskStatus
_ALL_LIVE: Final = frozenset(LIVE)

TRANSITIONS: Final[Mapping[TaskEvent, tuple[frozenset[TaskStatus], TaskStatus]]] = MappingProxyType(
    {
        TaskEvent.CLAIM: (frozenset({_S.PENDING}), _S.DISPATCHING),
        TaskEvent.RECLAIM: (frozenset({_S.DISPATCHING}), _S.DISPATCHING),
        TaskEvent.ACCEPT: (frozenset({_S.DISPATCHING}), _S.EXECUTING),
        TaskEvent.RETRY: (frozenset({_S.DISPATCHING, _S.EXECUTING, _S.WAITING}), _S.PENDING),
        TaskEvent.SUCCEED: (_ALL_LIVE, _S.SUCCESS),
        TaskEvent.FAIL: (_ALL_LIVE, _S.FAILED),
        TaskEvent.DEAD_LETTER: (_ALL_LIVE, _S.DEAD),
        TaskEvent.CANCEL: (_ALL_LIVE | {_S.AWAITING_APPROVAL}, _S.CANCELLED),
        TaskEvent.APPROVE: (frozenset({_S.AWAITING_APPROVAL}), _S.PENDING),
        TaskEvent.REJECT: (frozenset({_S.AWAITING_APPROVAL}), _S.FAILED),
        TaskEvent.REPLAY: (frozenset({_S.DEAD}), _S.PENDING),
        TaskEvent.WAIT: (frozenset({_S.DISPATCHING, _S.EXECUTING}), _S.WAITING),
        TaskEvent.RESUME: (frozenset({_S.WAITING}), _S.EXECUTING),
    }
)
"""event -> (the statuses it may happen in, the status it leads to)."""

_ENDINGS: Final = MappingProxyType(
    {
        _S.SUCCESS: TaskEvent.SUCCEED,
        _S.FAILED: TaskEvent.FAIL,
        _S.DEAD: TaskEvent.DEAD_LETTER,
        _S.CANCELLED: TaskEvent.CANCEL,
    }
)


def transition(current: TaskStatus, event: TaskEvent) -> TaskStatus:
    """The status ``event`` leads to from ``current``; `IllegalTransition` if none."""
    sources, target = TRANSITIONS[event]
    if current not in sources:
        raise IllegalTransition(
            f"a task that is {current} cannot {event.replace('_', '-')}",
            task_status=str(current),  # not ``status``: that is the problem's HTTP status
            event=str(event),
        )
    return target


def sources_of(event: TaskEvent) -> frozenset[TaskStatus]:
    """The statuses in which ``event`` may happen (for a statement's WHERE guard)."""
    return TRANSITIONS[event][0]


def target_of(event: TaskEvent) -> TaskStatus:
    """The status ``event`` leads to (for a statement's SET clause)."""
    return TRANSITIONS[event][1]


def ending(status: TaskStatus) -> TaskEvent:
    """The event that ends a task in the terminal ``status`` (``dead`` -> DEAD_LETTER)."""
    try:
        return _ENDINGS[status]
    except KeyError:
        raise ValueError(f"{status!r} is not a terminal status") from None
