"""The plan's sizes fit what the hub does with them (pure arithmetic, no processes)."""

from __future__ import annotations

import pytest

from bench.scenarios import Plan
from reach.hub.settings import RouterSettings


@pytest.mark.parametrize("level", ["smoke", "quick", "full"])
def test_a_fault_caller_waits_past_the_outage_and_two_breaker_trials(level: str) -> None:
    plan = Plan(level=level)
    schedule = (1 + 2 + 4 + 8 + 16) * 1.2
    assert plan.breaker_trial == RouterSettings().breaker_trial_interval
    assert plan.fault_wait > schedule
    assert plan.fault_wait >= plan.fault_phases[1] + 2 * plan.breaker_trial


@pytest.mark.parametrize("level", ["quick", "full"])
def test_the_in_flight_run_stays_under_the_queue_bound(level: str) -> None:
    plan = Plan(level=level)
    bound = int(plan.hub_settings.get("REACH_ROUTER__MAX_QUEUE", RouterSettings().max_queue))
    assert bound > plan.inflight_tasks
