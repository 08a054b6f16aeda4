"""The written results follow the contract other tools read: ``latest.json`` with
``scenarios``/``baselines``/``max_throughput``, a Markdown table and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import soak
from bench.cli import targets
from bench.report import SCENARIOS, _throughput_change, markdown, write


def _row(p50: float, p99: float, lost: int = 0) -> dict[str, Any]:
    return {
        "rate": 100.0,
        "p50_ms": p50,
        "p95_ms": p99 * 0.8,
        "p99_ms": p99,
        "errors": 0,
        "lost": lost,
        "peak_rss_mb": 300.0,
        "requests": 600,
        "offered_rate": 100.0,
    }


def _result() -> dict[str, Any]:
    return {
        "meta": {
            "command": "python -m bench",
            "started": "2026-11-29T22:00:00+00:00",
            "quick": False,
            "machine": "2 cores",
        },
        "scenarios": {
            "single_hop": _row(9.0, 30.0),
            "channel_single_hop": _row(10.0, 33.0),
            "two_hop": _row(20.0, 120.0),
            "broadcast5": _row(30.0, 90.0),
            "inflight2000": _row(1500.0, 8000.0),
            "fault": _row(10.0, 40.0, lost=1),
        },
        "baselines": {
            "direct_http": {**_row(3.0, 12.0), "max_throughput": 600.0},
            "plain_celery": {**_row(8.0, 22.0), "max_throughput": 250.0},
        },
        "max_throughput": 240.0,
        "details": {
            "channel": {
                "rate": 20.0,
                "sustained": True,
                "http_p50_ms": 10.0,
                "channel_p50_ms": 13.0,  # 1.3x: over the 1.2x limit
                "http_saturated": 60.0,
                "channel_saturated": 55.0,  # 0.92x: at least 1/1.2
                "http_cpu_ms_per_msg": 10.0,
                "channel_cpu_ms_per_msg": 11.0,
            },
            "inflight2000": {"tasks": 2000, "wall_s": 9.0, "wall_limit_s": 11.4},
            "fault": {
                "timeline_per_s": [30, 31, 29, 40, 3, 0, 1, 0, 30],
                "outage_from_s": 3,
                "outage_to_s": 8,
                "normal_rate": 30.0,
                "outage_peak_rate": 40,
                "outage_mean_rate": 8.8,
                "peak_to_normal": 1.33,
                "outcomes": {"success": 100, "fast_failure": 50},
            },
        },
    }


def test_files_follow_the_contract(tmp_path: Path) -> None:
    paths = write(_result(), tmp_path)
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert set(latest["scenarios"]) == set(SCENARIOS)
    for row in latest["scenarios"].values():
        assert {"rate", "p50_ms", "p95_ms", "p99_ms", "errors", "lost", "peak_rss_mb"} <= set(row)
    assert latest["max_throughput"] == 240.0 and set(latest["baselines"]) == {
        "direct_http",
        "plain_celery",
    }
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {p.name for p in pngs} == {"latency.png", "fault.png"}
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "latest.md").read_text() == markdown(latest)


def test_markdown_quotes_every_scenario_and_baseline() -> None:
    text = markdown(_result())
    for name in (*SCENARIOS, "direct_http", "plain_celery"):
        assert f"| {name} |" in text
    assert "`python -m bench`" in text
    assert "| 240.0 |" not in text and "240.0 msg/s" in text


def test_targets_are_judged_against_the_issue() -> None:
    verdicts = {t.name: t.met for t in targets(_result())}
    assert verdicts["max single-hop throughput, msg/s (p99 ≤ 100 ms)"] is False  # 240 < 300
    assert verdicts["max throughput ÷ plain Celery at equal concurrency"] is False  # 0.96
    assert verdicts["single hop @100/s p50 ms"] is False  # 9 > 5
    assert verdicts["two hops @100/s p99 ms"] is False  # 120 > 50
    assert verdicts["broadcast to 5 @50/s p99 ms"] is True
    assert verdicts["in-flight run wall time s"] is True
    assert verdicts["fault: peak rate at failing agent ÷ normal"] is True
    assert verdicts["fault run lost tasks"] is False  # one lost is one too many
    assert verdicts["channel ÷ HTTP p50 @20/s"] is False
    assert verdicts["channel ÷ HTTP saturated rate"] is True
    assert verdicts["channel ÷ HTTP CPU per delivery"] is True
    unsustained = _result()
    unsustained["details"]["channel"].update(sustained=False, channel_p50_ms=10.0)
    verdicts = {t.name: t.met for t in targets(unsustained)}
    assert verdicts["channel ÷ HTTP p50 @20/s"] is False  # a saturated hub shows no ratio


def _flow() -> dict[str, Any]:
    return {
        "retry_storm": {
            "callers": 5, "offered_rate": 10.0, "rereach": 3, "phases_s": [10, 40, 15],
            "normal_rate": 10.0, "outage_mean_rate": 4.0, "outage_to_normal": 0.4,
            "outage_peak_rate": 13, "dead_lettered": 2, "dead_lettered_breaker": 1,
            "refusal_p50_ms": 8.0, "refusal_p99_ms": 40.0, "accepted_p50_ms": 20.0,
            "accepted_p99_ms": 30_000.0, "answered_after_recovery_s": 12.0,
            "trial_interval_s": 30.0, "not_ended": 0, "send_outcomes": {"success": 9},
        },
        "loop": {
            "alert_roots": 5, "alert_threshold": 3, "tasks_created": 2,
            "stopped_at_first_repeat": True, "stop_s": 0.4, "root_outcome": "BusinessError",
            "alert_raised": False, "alert_metric": 0.0, "alert_links_suspected": [], "lost": 0,
        },
        "priority": {
            "online_rate": 20.0, "background_rate": 24.0, "background_latency_s": 0.25,
            "unloaded": _row(10.0, 30.0), "loaded": _row(15.0, 75.0), "p99_ratio": 2.5,
            "background_backlog_at_start": 20, "background_backlog_at_end": 40, "lost": 0,
        },
        "backpressure": {
            "offered_rate": 100.0, "duration_s": 30.0, "agent_latency_s": 0.2,
            "max_queue": 100, "accepted": 700, "accepted_completed": 700,
            "accepted_not_completed": 0, "refused_backpressure": 2300,
            "retry_after_ms_min": 600.0, "retry_after_ms_max": 5000.0, "refusals_unusable": 0,
            "idle_rss_mb": 800.0, "peak_rss_mb": 820.0, "rss_growth_mb": 20.0, "lost": 0,
        },
    }  # fmt: skip


def test_flow_control_rows_and_targets() -> None:
    result = {**_result(), "flow": _flow()}
    text = markdown({**result, "targets": [t.as_dict() for t in targets(result)]})
    for name in ("retry_storm", "loop", "priority", "backpressure"):
        assert f"| {name} |" in text
    verdicts = {t.name: t.met for t in targets(result)}
    assert verdicts["retry storm: failing agent's rate during the outage ÷ normal"] is True
    assert verdicts["retry storm: tasks dead-lettered because the breaker was open"] is False
    assert verdicts["retry storm: refusals (circuit open, backpressure) p99 ms"] is True
    assert verdicts["loop: tasks created by a two-agent loop"] is True
    assert verdicts["loop: dependency-loop alert raised (1 = yes)"] is False
    assert verdicts["priority: online p99 under a background flood ÷ unloaded"] is False
    assert verdicts["backpressure: accepted tasks not completed"] is True
    assert verdicts["backpressure: hub RSS growth during the flood, MB"] is True


@pytest.mark.parametrize(
    ("loss_pct", "said"),
    [
        (4.0, "4.0 % less throughput with the rows"),
        (-19.5, "19.5 % more throughput with the rows"),  # never "-19.5 % lost"
        (None, "no rate on the empty store to compare with"),
    ],
)
def test_table_scale_says_which_way_the_rate_moved(loss_pct: float | None, said: str) -> None:
    assert _throughput_change(loss_pct) == said


def _windows(p99s: list[float | None], rss: float = 900.0) -> list[dict[str, Any]]:
    return [
        {"from_s": 300.0 * n, "requests": 30000, "errors": 0, "p50_ms": 10.0, "p99_ms": p99,
         "rss_mb": rss + n}
        for n, p99 in enumerate(p99s)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("p99s", "drift"),
    [
        ([30.0, 31.0, 29.0, 32.0], 1.067),  # flat: within 10 % either way
        ([30.0, 45.0], 1.5),  # the p99 grew
        ([30.0, 20.0], 1.5),  # it fell just as far: not flat either
        # the run of 2026-12-06 07:03: the first window queued, the rest swung below it and
        # back; upward only, every window read <= 1 of the first
        ([12_993.5, 9_170.2, 1_542.0, 1_699.2, 875.9, 12_650.1], 14.834),
        ([30.0], None),  # nothing to compare with
        ([None, 30.0], None),  # the first window answered nothing
        ([30.0, None, 33.0], 1.1),  # a window without answers is left out
    ],
)
def test_the_soak_is_flat_only_within_its_band_both_ways(
    p99s: list[float | None], drift: float | None
) -> None:
    assert soak.drift(_windows(p99s), "p99_ms") == drift


def test_a_soak_whose_first_window_queued_is_not_met() -> None:
    result = _result()
    result["soak"] = {"windows": _windows([13_000.0, 9_000.0, 900.0, 12_700.0]), "lost": 0}
    verdicts = {t.name: (t.value, t.met) for t in targets(result)}
    assert verdicts["soak: p99 of any window against the first, up or down (factor)"] == (
        14.444,
        False,
    )
    assert verdicts["soak: hub RSS of any window against the first, up or down (factor)"][1] is True
    assert verdicts["soak: tasks lost"] == (0, True)
    result["soak"]["windows"] = _windows([30.0, 31.0, 32.0])
    verdicts = {t.name: (t.value, t.met) for t in targets(result)}
    assert verdicts["soak: p99 of any window against the first, up or down (factor)"][1] is True


def test_a_limit_reads_as_the_issue_states_it() -> None:
    """The fleet's 1.25 once printed as "≤ 1.2": a value of 1.22 read as over it."""
    result = _result()
    result["fleet"] = {
        "rate": 100.0, "p99_ratio": 1.22, "min_registrations_per_s": 250.0, "max_page_ms": 9.0,
        "sizes": {"0": {"routing": {"p50_ms": 5.0, "p99_ms": 10.0, "errors": 0},
                        "registrations_per_s_at_size": 250.0,
                        "page": {"p50_ms": 4.0, "p99_ms": 9.0}},
                  "2000": {"routing": {"p50_ms": 5.0, "p99_ms": 12.2, "errors": 0},
                           "registrations_per_s_at_size": 250.0,
                           "page": {"p50_ms": 4.0, "p99_ms": 9.0}}},
    }  # fmt: skip
    result["targets"] = [t.as_dict() for t in targets(result)]
    text = markdown(result)
    assert "idle instances ÷ with none | 1.2 | ≤ 1.25 | yes |" in text
    assert "| max single-hop throughput, msg/s (p99 ≤ 100 ms) | 240.0 | ≥ 300 | **no** |" in text
    # a limit that could not be known (no throughput measured): "-", as a value would read
    result["details"]["inflight2000"]["wall_limit_s"] = float("nan")
    result["targets"] = [t.as_dict() for t in targets(result)]
    assert "| in-flight run wall time s | 9.0 | ≤ - | **no** |" in markdown(result)


def _tokens(with_cpu: bool) -> dict[str, Any]:
    run = {"saturated_rate": 100.0}
    out: dict[str, Any] = {
        "rounds": 1, "callers": 32, "rate": 50.0, "runs": {"on": [run], "off": [run]},
        "saturated_on": 90.0, "saturated_off": 100.0, "throughput_cost_pct": 10.0,
        "p50_on_ms": 12.0, "p50_off_ms": 11.0, "p99_on_ms": 30.0, "p99_off_ms": 28.0,
    }  # fmt: skip
    if with_cpu:
        out.update(
            cpu_on_ms=19.3,
            cpu_off_ms=19.0,
            cpu_by_role_ms={
                "on": {"worker": 7.8, "agent": 0.97},
                "off": {"worker": 7.6, "agent": 0.6},
            },
        )
    return out


def test_the_tokens_part_says_what_a_message_costs_on_and_off() -> None:
    result = _result()
    result["tokens"] = _tokens(with_cpu=True)
    assert (
        "CPU per message at 50.0/s, all processes (on / off): 19.3 / 19.0 ms; by process: "
        "worker 7.8 / 7.6, agent 1.0 / 0.6." in markdown(result)
    )
    # a run from before the part measured CPU reads as it did
    result["tokens"] = _tokens(with_cpu=False)
    text = markdown(result)
    assert "Each run's saturated rate (on / off): 100.0 / 100.0" in text
    assert "CPU per message at" not in text


def test_the_in_flight_run_reads_against_its_limit_and_seed_004s_p99() -> None:
    result = _result()
    result["details"]["inflight2000"]["agent"] = "2 instances, def handler answering after 1 s"
    text = markdown(result)
    assert (
        "In flight: 2,000 tasks at once to 2 instances, def handler answering after 1 s: wall "
        "9.0 s (the median run's; limit 1 s + tasks ÷ max throughput: 11.4 s); p99 8,000.0 ms "
        "(seed 004 after tuning: 920 ms); hub peak RSS 300.0 MB." in text
    )
    del result["details"]["inflight2000"]  # a run without the part's detail: no line
    assert "In flight:" not in markdown(result)


def _traced(on: list[float], off: list[float], exports_off: int = 0) -> dict[str, Any]:
    """A tracing part's result (``bench.tracing.measure``) from each round's hub CPU."""
    from bench.tracing import paired_costs

    def row(cpu: float, exports: int) -> dict[str, Any]:
        return {"lost": 0, "hub_cpu_ms_per_msg": cpu, "exports": exports,
                "cpu_ms_per_msg": {"api": cpu / 2, "worker": cpu / 2}}  # fmt: skip

    runs = {"on": [row(c, 9) for c in on], "off": [row(c, exports_off) for c in off]}
    mean_on, mean_off = sum(on) / len(on), sum(off) / len(off)
    paired = paired_costs(runs)
    return {
        "rounds": len(on), "rate": 50.0, "runs": runs,
        "hub_cpu_on_ms": mean_on, "hub_cpu_off_ms": mean_off,
        "hub_cpu_cost_pct": round(100 * (mean_on - mean_off) / mean_off, 1),
        "paired_cost_pct": paired, "paired_median_pct": sorted(paired)[len(paired) // 2],
        "exports_off": exports_off,
        "by_role_ms": {m: {"api": 5.0, "worker": 5.0} for m in ("on", "off")},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("on", "off", "exports_off", "cost_met", "off_met"),
    [
        ([10.5, 11.0], [10.0, 10.5], 0, True, True),  # +4.9 %
        ([10.6, 11.1], [10.0, 10.5], 0, False, True),  # +5.8 %
        ([10.0], [10.0], 3, True, False),  # off exported spans: not off
    ],
)  # fmt: skip
def test_tracing_targets_judge_the_cost_on_and_nothing_off(
    on: list[float], off: list[float], exports_off: int, cost_met: bool, off_met: bool
) -> None:
    result = {**_result(), "tracing": _traced(on, off, exports_off)}
    verdicts = {t.name: t.met for t in targets(result)}
    assert verdicts["tracing on: hub CPU per message over off, %"] is cost_met
    assert verdicts["tracing off: spans exported"] is off_met
    assert verdicts["tracing runs lost tasks"] is True


def test_tracing_rounds_are_paired_on_against_the_off_after_it() -> None:
    from bench.tracing import paired_costs

    runs = {
        "on": [{"hub_cpu_ms_per_msg": 11.0}, {"hub_cpu_ms_per_msg": 9.0},
               {"hub_cpu_ms_per_msg": 12.0}],
        "off": [{"hub_cpu_ms_per_msg": 10.0}, {"hub_cpu_ms_per_msg": 10.0},
                {"hub_cpu_ms_per_msg": None}],  # a round that failed to measure: left out
    }  # fmt: skip
    assert paired_costs(runs) == [10.0, -10.0]
    text = markdown({**_result(), "tracing": _traced([10.5, 11.2], [10.0, 11.0])})
    assert "Tracing (2 round(s) of on/off" in text
    assert "each round, on against the off right after it: 5.0 %, 1.8 %" in text
