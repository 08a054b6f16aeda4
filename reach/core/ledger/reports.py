"""Whose result or progress report a task takes: the attempt it waits on, from its instance.

After a 202 the agent reports later (``POST /v1/tasks/{id}/result``). Only the delivery
the task is waiting on may decide it: the report must name the task's current
``attempt_seq`` and come from the instance that attempt was dispatched to, while that
attempt is out (``dispatching`` or ``executing``). A report for an older attempt (a
retry or redelivery moved on), from another instance, or for an attempt not dispatched
yet is refused -- and recorded, never applied. A task that is terminal already keeps its
first result; a later report is only kept as an event, as it always was.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from reach.core.ledger.statuses import TERMINAL, TaskStatus

__all__ = ["AWAITING_REPORT", "Verdict", "judge_report"]

AWAITING_REPORT: Final = frozenset({TaskStatus.DISPATCHING, TaskStatus.EXECUTING})
"""The statuses in which the current attempt is out at an instance and may be reported."""


class Verdict(StrEnum):
    APPLY = "apply"  # the current attempt's own instance: the report decides the task
    LATE = "late"  # the task is terminal: first result wins, the report is an event
    STALE = "stale"  # another attempt or instance: refused and recorded


def judge_report(
    status: TaskStatus,
    current_attempt: int,
    current_instance: str | None,
    attempt_seq: int,
    instance_id: str,
) -> Verdict:
    """What to do with a report naming (``attempt_seq``, ``instance_id``)."""
    if status in TERMINAL:
        return Verdict.LATE
    if (
        status in AWAITING_REPORT
        and attempt_seq == current_attempt
        and instance_id == current_instance
    ):
        return Verdict.APPLY
    return Verdict.STALE
