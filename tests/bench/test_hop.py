"""bench.hop's arithmetic: a call split at its moments, the summary, and the worker's log
lines read back as moments (the run itself is `python -m bench.hop`, not a test)."""

from __future__ import annotations

import time

import pytest

from bench import hop


def test_a_call_splits_into_its_stages_and_they_add_up() -> None:
    marks = hop.Marks(
        sent=100.000, accepted=100.002, received=100.007, claimed=100.0095, finished=100.013,
        answered=100.0165,
    )  # fmt: skip
    got = hop.split(marks)
    assert list(got) == [*hop.STAGES, "total"]
    assert [round(got[s], 3) for s in hop.STAGES] == [2.0, 5.0, 2.5, 3.5, 3.5]
    assert got["total"] == pytest.approx(sum(got[s] for s in hop.STAGES))


def test_the_summary_is_the_median_and_mean_of_each_stage() -> None:
    base = dict.fromkeys((*hop.STAGES, "total"), 1.0)
    splits = [{**base, "total": t} for t in (10.0, 20.0, 60.0)]
    got = hop.summary(splits)
    assert got["total"] == {"p50_ms": 20.0, "mean_ms": 30.0}
    assert got[hop.STAGES[0]] == {"p50_ms": 1.0, "mean_ms": 1.0}
    with pytest.raises(ValueError):
        hop.summary([])


def test_only_the_worker_main_process_receiving_a_delivery_counts() -> None:
    log = "\n".join(
        [
            "[2026-12-06 10:47:40,615: INFO/MainProcess] Task reach.deliver[fbe58f48-6e2e-42eb"
            "-ba37-c1afe99f21b2] received",
            # another task's message, a child's line and a warning are not deliveries received
            "[2026-12-06 10:47:40,620: INFO/MainProcess] Task reach.probe_sweep[0d1f] received",
            "[2026-12-06 10:47:40,623: INFO/ForkPoolWorker-3] Task reach.deliver[fbe58f48-6e2e"
            "-42eb-ba37-c1afe99f21b2] succeeded in 0.0068s: None",
            "[2026-12-06 10:47:40,640: WARNING/MainProcess] Task reach.deliver[ab] received",
            "[2026-12-06 10:47:41,002: INFO/MainProcess] Task reach.deliver[66957ee6-f907-46f8"
            "-8919-1310146d4e74] received",
        ]
    )
    got = hop.received_times(log)
    local = time.mktime(time.strptime("2026-12-06 10:47:40", "%Y-%m-%d %H:%M:%S"))
    assert got == [pytest.approx(local + 0.615), pytest.approx(local + 1.002)]
