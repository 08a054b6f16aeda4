"""Every status the hub stores or reports, defined once.

They are ``str`` enums, so a member is the very string stored in the database and sent
on the wire (``TaskStatus.SUCCESS == "success"``): no migration, no translation layer,
and a value read back from a row compares equal to the member.

A broadcast target is a task pinned to one instance, so its status *is* a `TaskStatus`;
a second enum with the same values would be two names for one meaning.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "LIVE",
    "TERMINAL",
    "ApprovalStatus",
    "DagRunStatus",
    "InstanceStatus",
    "NodeStatus",
    "TaskStatus",
]


class TaskStatus(StrEnum):
    """Where a task is in its lifecycle (``reach.core.ledger.lifecycle`` says how it moves)."""

    PENDING = "pending"  # an attempt is queued (first, retry or replay)
    DISPATCHING = "dispatching"  # a worker holds the attempt's lease and is calling the agent
    EXECUTING = "executing"  # the agent accepted (202); its result comes later
    WAITING = "waiting"  # an A2A agent asked for input or authorisation (the caller's move)
    AWAITING_APPROVAL = "awaiting_approval"  # parked until a named human decides
    SUCCESS = "success"
    FAILED = "failed"
    DEAD = "dead"  # retries exhausted: waits in the dead-letter queue
    CANCELLED = "cancelled"


TERMINAL: Final = frozenset(
    {TaskStatus.SUCCESS, TaskStatus.FAILED, TaskStatus.DEAD, TaskStatus.CANCELLED}
)
"""A task in one of these has its answer: the first terminal result wins, later ones are
recorded as events only. ``dead`` is terminal too (only an operator's replay revives it)."""

LIVE: Final = frozenset(
    {TaskStatus.PENDING, TaskStatus.DISPATCHING, TaskStatus.EXECUTING, TaskStatus.WAITING}
)
"""A task in delivery's hands: any of these may end (succeed, fail, die, be cancelled)."""


class InstanceStatus(StrEnum):
    """An instance's state as routing sees it (``reach.core.fleet.reachability`` decides it)."""

    ONLINE = "online"
    DEGRADED = "degraded"
    UNREACHABLE = "unreachable"
    OFFLINE = "offline"
    DEREGISTERED = "deregistered"


class NodeStatus(StrEnum):
    """Terminal state of one node in a DAG run."""

    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"


class DagRunStatus(StrEnum):
    """Where a DAG run is: ``running`` until its closing task (or the beat sweep, when its
    chord died) settles it as ``success`` or ``failed`` with a stated reason."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class ApprovalStatus(StrEnum):
    """Where a human decision on a parked task is: ``pending`` until someone approves or
    rejects it, its time runs out (``expired``, by the beat sweep) or the task is cancelled."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
