"""The bench's semantic part at its smallest size (``python -m bench --smoke --only
semantic``): a hub with the model, the demo sales agent, the three kinds of submit. It
asserts what holds at any speed (every submit accepted and matched, every figure
written); the added latency itself is the benchmark's business, never a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]


def test_the_semantic_part_measures_all_three_kinds(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "BENCH_PG_DATABASE": "reach_bench_semantic",  # not the main bench smoke's database
        "BENCH_REDIS_URL": os.environ.get("REACH_TEST_REDIS_URL", "redis://127.0.0.1:6379") + "/11",
    }
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "semantic", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    row = json.loads((tmp_path / "latest.json").read_text())["semantic"]
    assert row["errors"] == 0, row
    for kind in ("capability", "intent_new", "intent_seen"):
        assert row[f"{kind}_p50_ms"] > 0 and row[f"{kind}_p95_ms"] > 0, row
    assert isinstance(row["added_p50_ms"], float) and row["api_rss_mb"] > 0
    assert "| intent, new each time (embedded) |" in run.stdout
    targets = json.loads((tmp_path / "latest.json").read_text())["targets"]
    assert "semantic send: added p50 ms (a new intent)" in {t["name"] for t in targets}
