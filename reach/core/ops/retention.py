"""What the retention sweep may delete: pure cut-offs from the clock and the policy.

Finished records (terminal tasks with everything written about them, resolved dead
letters, finished DAG runs, broadcasts past their deadline, instance events, ended
sessions, cleared loop suspicions) are kept ``days``; an instance offline for
``offline_instance_hours`` is presumed gone for good (an agent that comes back registers
again), and so is an agent left with no instance that long. An unresolved dead letter
holds its task's full payload for an operator to replay: it is kept ``dead_letter_days``,
then goes with its task. The audit trail is kept ``audit_days``.
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
    dead_letter_days: float = 14.0
    audit_days: float = 90.0

    def __post_init__(self) -> None:
        for name in ("days", "offline_instance_hours", "dead_letter_days", "audit_days"):
            if getattr(self, name) <= 0:
                raise ValueError(f"retention {name} must be positive")
        if self.batch_size < 1 or self.batches < 1:
            raise ValueError("retention batch_size and batches must be at least 1")


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Records that ended before ``records`` go; instances offline since before ``offline``
    (and agents without instances since then); unresolved dead letters made before
    ``dead_letters``; audit rows written before ``audit``."""

    records: float
    offline: float
    dead_letters: float
    audit: float


def cutoffs(now: float, policy: RetentionPolicy) -> Cutoffs:
    return Cutoffs(
        records=now - policy.days * DAY_S,
        offline=now - policy.offline_instance_hours * HOUR_S,
        dead_letters=now - policy.dead_letter_days * DAY_S,
        audit=now - policy.audit_days * DAY_S,
    )
