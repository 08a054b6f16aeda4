"""The plan's sizes fit what the hub does with them (pure arithmetic, no processes)."""

from __future__ import annotations

import pytest

from bench.scenarios import Plan
from reach.hub.settings import RouterSettings


@pytest.mark.parametrize("level", ["smoke", "quick", "full"])
def test_a_fault_caller_waits_past_the_outage_and_two_breaker_trials(level: str) -> None:
    plan = Plan(level=level)
    schedule = (1 + 2 + 4 + 8 + 16) * 1.2
    # the trial the hub runs with: the default in the table, shortened only in the smoke run
    default = RouterSettings().breaker_trial_interval
    assert plan.breaker_trial == (2.0 if level == "smoke" else default)
    trial = plan.hub_settings.get("REACH_ROUTER__BREAKER_TRIAL_INTERVAL")
    assert trial == ("2" if level == "smoke" else None)
    assert plan.fault_wait > schedule
    assert plan.fault_wait >= plan.fault_phases[1] + 2 * plan.breaker_trial


def test_hub_env_sets_the_trial_the_fault_callers_wait_for() -> None:
    plan = Plan(level="full", hub_env=(("REACH_ROUTER__BREAKER_TRIAL_INTERVAL", "50"),))
    assert plan.breaker_trial == 50.0
    assert plan.fault_wait >= plan.fault_phases[1] + 2 * 50.0


@pytest.mark.parametrize("level", ["quick", "full"])
def test_the_in_flight_run_stays_under_the_queue_bound(level: str) -> None:
    plan = Plan(level=level)
    bound = int(plan.hub_settings.get("REACH_ROUTER__MAX_QUEUE", RouterSettings().max_queue))
    assert bound > plan.inflight_tasks


@pytest.mark.parametrize("level", ["smoke", "quick", "full"])
def test_hub_env_reaches_the_hubs_settings(level: str) -> None:
    from bench.cli import parser

    args = parser().parse_args(["--hub-env", "REACH_ROUTER__BREAKER_STREAK=10"])
    plan = Plan(level=level, hub_env=tuple(args.hub_env))
    assert plan.hub_settings["REACH_ROUTER__BREAKER_STREAK"] == "10"
    assert "REACH_ROUTER__BREAKER_STREAK" not in Plan(level=level).hub_settings


@pytest.mark.parametrize(
    "argv",
    [
        ["--hub-env", "ROUTER__BREAKER_STREAK=10"],  # not a hub setting
        ["--hub-env", "REACH_ROUTER__BREAKER_STREAK"],  # no value
        ["--readme", "--hub-env", "REACH_ROUTER__BREAKER_STREAK=10"],  # the table: defaults
    ],
)
def test_hub_env_refuses_what_it_cannot_measure(argv: list[str]) -> None:
    from bench.cli import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2


@pytest.mark.parametrize(
    ("argv", "level", "command"),
    [
        ([], "full", "python -m bench"),
        (["--quick", "--only", "cost", "--cost-rate", "50"], "quick",
         "python -m bench --quick --only cost --cost-rate 50"),
        (["--only", "fleet", "--fleet-rate", "20", "--hub-env", "REACH_STORAGE__POOL_SIZE=5"],
         "full",
         "python -m bench --only fleet --hub-env REACH_STORAGE__POOL_SIZE=5 --fleet-rate 20"),
        (["--only", "tracing", "--rounds", "6"], "full",
         "python -m bench --only tracing --rounds 6"),
    ],
)  # fmt: skip
def test_the_report_quotes_the_command_that_reproduces_the_run(
    argv: list[str], level: str, command: str
) -> None:
    # a rate that changes what is measured is part of the command (a fleet part at
    # 20/s is not the one at the plan's 100/s)
    from bench.cli import command_of, parser

    args = parser().parse_args(argv)
    assert command_of(args, level, tuple(args.hub_env)) == command


@pytest.mark.parametrize(
    ("argv", "level", "rounds"),
    [([], "full", 2), (["--quick"], "quick", 1), (["--rounds", "6"], "full", 6),
     (["--quick", "--rounds", "3"], "quick", 3)],
)  # fmt: skip
def test_rounds_of_the_on_off_parts_follow_the_level_unless_given(
    argv: list[str], level: str, rounds: int
) -> None:
    from bench.cli import parser

    args = parser().parse_args(argv)
    assert Plan(level=level, rounds=args.rounds).token_rounds == rounds


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_rounds_must_be_a_whole_number_of_one_or_more(bad: str) -> None:
    from bench.cli import parser

    with pytest.raises(SystemExit) as caught:
        parser().parse_args(["--rounds", bad])
    assert caught.value.code == 2
