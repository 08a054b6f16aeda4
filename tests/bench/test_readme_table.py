"""The benchmark table of ``docs/benchmarks.md`` is the latest full run's
``bench/results/latest.md``, byte for byte (``python -m bench --readme`` writes both)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bench import readme


def test_the_docs_table_is_the_latest_full_run() -> None:
    assert readme.PAGE == readme.REPO / "docs" / "benchmarks.md"
    assert readme.block(readme.PAGE.read_text()) == (
        (readme.RESULTS / "latest.md").read_text().strip()
    )
    meta = json.loads((readme.RESULTS / "latest.json").read_text())["meta"]
    assert meta.get("level", "full") == "full" and not meta.get("only"), meta


def test_a_table_replaces_only_the_block() -> None:
    text = f"intro\n{readme.START}\nold\n{readme.END}\nafter\n"
    new = readme.with_table(text, "| a |\n")
    assert new == f"intro\n{readme.START}\n| a |\n{readme.END}\nafter\n"
    assert readme.block(new) == "| a |"


@pytest.mark.parametrize("text", ["no markers", f"{readme.END} x {readme.START}"])
def test_a_page_without_its_block_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        readme.with_table(text, "| a |")


def test_only_a_full_run_of_every_part_goes_into_the_docs(tmp_path: Path) -> None:
    (tmp_path / "latest.md").write_text("| quick |\n")
    (tmp_path / "latest.json").write_text(
        json.dumps({"meta": {"command": "python -m bench --quick", "level": "quick"}})
    )
    target = tmp_path / "benchmarks.md"
    target.write_text(f"{readme.START}\nold\n{readme.END}\n")
    with pytest.raises(SystemExit):
        readme.update(tmp_path, target)
    assert "old" in target.read_text()


def test_a_full_run_in_which_a_part_failed_stays_out_of_the_docs(tmp_path: Path) -> None:
    (tmp_path / "latest.md").write_text("| gap |\n")
    meta = {"command": "python -m bench", "level": "full", "failed": {"soak": "OSError: x"}}
    (tmp_path / "latest.json").write_text(json.dumps({"meta": meta}))
    target = tmp_path / "benchmarks.md"
    target.write_text(f"{readme.START}\nold\n{readme.END}\n")
    with pytest.raises(SystemExit, match="soak"):
        readme.update(tmp_path, target)
    assert "old" in target.read_text()


def test_a_rescore_judges_the_run_again_and_leaves_its_measurements(tmp_path: Path) -> None:
    """A rule corrected after the run: the verdicts follow the code, the figures do not move,
    and the dated copy stays as the run wrote it."""
    windows = [
        {"from_s": 300.0 * n, "requests": 30000, "errors": 0, "p50_ms": 9.0, "p99_ms": p99,
         "rss_mb": 920.0}
        for n, p99 in enumerate([13_000.0, 9_000.0, 900.0])
    ]  # fmt: skip
    run = {
        "meta": {"command": "python -m bench", "started": "2026-12-06T07:03:46+00:00",
                 "level": "full", "quick": False, "machine": "2 cores"},
        "scenarios": {}, "baselines": {}, "max_throughput": None, "details": {},
        "soak": {"duration_s": 900.0, "window_s": 300.0, "rate": 100.0,
                 "flap": {"down_s": 20.0, "period_s": 60.0, "rate": 30.0},
                 "windows": windows, "p99_drift": 0.692, "rss_drift": 1.0, "errors": 0,
                 "flaky_outcomes": {"success": 1}, "lost": 0},
        # what the one-sided rule said at the time
        "targets": [{"name": "soak: p99 of any window ÷ the first", "value": 0.692,
                     "limit": 1.1, "at_most": True, "met": True}],
    }  # fmt: skip
    dated = json.dumps(run)
    (tmp_path / "20261206T070346-full.json").write_text(dated)
    (tmp_path / "latest.json").write_text(dated)
    (tmp_path / "latest.md").write_text("| the old table |\n")
    target = tmp_path / "benchmarks.md"
    target.write_text(f"intro\n{readme.START}\nold\n{readme.END}\n")

    readme.rescore(tmp_path, target, now=dt.datetime(2026, 12, 6, 10, 30, tzinfo=dt.UTC))

    again = json.loads((tmp_path / "latest.json").read_text())
    verdicts = {t["name"]: (t["value"], t["met"]) for t in again["targets"]}
    soak = "soak: p99 of any window against the first, up or down (factor)"
    assert verdicts[soak] == (14.44, False)
    assert again["soak"]["windows"] == windows and again["soak"]["p99_drift"] == 14.444
    assert again["meta"]["rescored"] == {
        "at": "2026-12-06T10:30:00+00:00",
        "command": "python -m bench.readme --rescore",
    }
    table = (tmp_path / "latest.md").read_text()
    assert "Targets judged again 2026-12-06T10:30:00+00:00" in table
    row = "| soak: p99 of any window against the first, up or down (factor) | 14.4 | ≤ 1.1 |"
    assert f"{row} **no** |" in table
    assert readme.block(target.read_text()) == table.strip()
    assert (tmp_path / "20261206T070346-full.json").read_text() == dated


def test_a_rescore_takes_only_a_full_run(tmp_path: Path) -> None:
    quick = json.dumps({"meta": {"command": "python -m bench --quick", "level": "quick"}})
    (tmp_path / "latest.json").write_text(quick)
    (tmp_path / "latest.md").write_text("| quick |\n")
    target = tmp_path / "benchmarks.md"
    target.write_text(f"{readme.START}\nold\n{readme.END}\n")
    with pytest.raises(SystemExit):
        readme.rescore(tmp_path, target)
    assert (tmp_path / "latest.json").read_text() == quick and "old" in target.read_text()
