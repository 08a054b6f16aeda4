"""The beat sweep's decision on a running DAG run: leave a healthy one alone, finish one
whose closing task went missing, resume a silent one, abandon one past its bounds."""

from __future__ import annotations

import pytest

from reach.core.orchestration.dags.sweep import RunClock, SweepAction, sweep_action
from reach.hub.settings import Settings
from reach.worker.schedule import beat_schedule

# created at 0, nodes may stay silent 10 s, the whole run may take 60 s; margin 5 s
RUN = RunClock(created_at=0.0, last_progress=0.0, worst_case_s=60.0, longest_node_s=10.0)


def at(last_progress: float) -> RunClock:
    return RunClock(0.0, last_progress, RUN.worst_case_s, RUN.longest_node_s)


@pytest.mark.parametrize(
    ("run", "all_finished", "now", "expected"),
    [
        (at(0.0), False, 1.0, SweepAction.LEAVE),  # just started
        (at(0.0), False, 15.0, SweepAction.LEAVE),  # silent 15 s: node timeout + margin
        (at(0.0), False, 15.1, SweepAction.RESUME),  # longer than any node may stay silent
        (at(50.0), False, 60.0, SweepAction.LEAVE),  # progressing, within its bound
        (at(60.0), False, 65.0, SweepAction.LEAVE),  # at its bound + margin exactly
        (at(60.0), False, 65.1, SweepAction.ABANDON),  # past it, even with recent progress
        (at(0.0), False, 300.0, SweepAction.ABANDON),  # long dead
        (at(10.0), True, 12.0, SweepAction.LEAVE),  # all done: its closing task is due
        (at(10.0), True, 15.1, SweepAction.FINISH),  # ... and went missing
        (at(10.0), True, 300.0, SweepAction.FINISH),  # settled from its results, not failed
    ],
)
def test_sweep_action(run: RunClock, all_finished: bool, now: float, expected: SweepAction) -> None:
    assert sweep_action(run, all_finished, now, margin_s=5.0) is expected


def waited(last_progress: float, waited_s: float, parked: bool = False) -> RunClock:
    return RunClock(0.0, last_progress, RUN.worst_case_s, RUN.longest_node_s, waited_s, parked)


@pytest.mark.parametrize(
    ("run", "now", "expected"),
    [
        (waited(0.0, 0.0, parked=True), 3600.0, SweepAction.LEAVE),  # a human decides
        (waited(0.0, 0.0, parked=True), 15.1, SweepAction.LEAVE),  # silence is not death
        (waited(3000.0, 3000.0), 3010.0, SweepAction.LEAVE),  # approved: age minus the wait
        (waited(3000.0, 3000.0), 3065.1, SweepAction.ABANDON),  # past its bound all the same
        (waited(3000.0, 3000.0), 3015.1, SweepAction.RESUME),  # silent since the decision
    ],
)
def test_time_spent_waiting_for_a_human_is_not_the_runs(
    run: RunClock, now: float, expected: SweepAction
) -> None:
    assert sweep_action(run, False, now, margin_s=5.0) is expected


def test_the_sweep_runs_on_its_own_cadence() -> None:
    entry = beat_schedule(Settings(dags={"sweep_interval": 2.5}))["reach.dag-sweep"]
    assert entry["task"] == "reach.dag_sweep"
    assert entry["schedule"] == 2.5 and entry["options"]["expires"] == 2.5
