"""What the retention sweep may delete: pure cut-offs from the clock and the policy.

Finished records (terminal tasks with their events and outbox rows, resolved dead letters,
finished DAG runs, broadcasts past their deadline, instance events) are kept ``days``;
an instance offline for ``offline_instance_hours`` is presumed gone for good (an agent
that comes back registers again).
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    days: float = 30.0
    offline_instance_hours: float = 24.0
    batch_size: int = 500
    batches: int = 4

    def __post_init__(self) -> None:
        if self.days <= 0 or self.offline_instance_hours <= 0:
            raise ValueError("retention days and offline_instance_hours must be positive")
        if self.batch_size < 1 or self.batches < 1:
            raise ValueError("retention batch_size and batches must be at least 1")


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Records that ended before ``records`` go; instances offline since before ``offline``."""

    records: float
    offline: float


def cutoffs(now: float, policy: RetentionPolicy) -> Cutoffs:
    return Cutoffs(
        records=now - policy.days * DAY_S,
        offline=now - policy.offline_instance_hours * HOUR_S,
    )
