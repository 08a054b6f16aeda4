"""Seed 000's deployment, as its article writes it: ``config.yaml`` with ``probe.interval:
5s``, ``storage.type: sqlite`` + ``storage.path`` and ``router.dead_letter: true`` starts a
hub with ``reach up --config``; ``reach api|worker|beat`` read the file their option names."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.acceptance.test_reach_up import reach_up, wait_banner
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import hub_env
from tests.support.waiting import wait_until
from tests.unit.test_seed_config import SEED_CONFIG


def test_reach_up_runs_the_seed_config_as_written(tmp_path: Path) -> None:
    data = tmp_path / "data"  # the article's /data, not made beforehand
    config = tmp_path / "config.yaml"
    config.write_text(SEED_CONFIG.format(data=data), encoding="utf-8")
    admin = free_port()  # the file's 8800/8900 may be taken here: the environment wins
    with reach_up(tmp_path, "--config", str(config), REACH_SERVER__ADMIN_PORT=str(admin)) as up:
        wait_banner(up)
        assert "data/agent-reach.db" in up.said()  # the banner names the store it runs on
        assert requests.get(f"http://127.0.0.1:{up.port}/healthz", timeout=5).ok
        agents = requests.get(f"http://127.0.0.1:{admin}/api/v1/agents", timeout=5)
        assert agents.status_code == 200 and agents.json()["agents"] == []
        # the worker and beat read the same file: beat's ticks run on the worker
        wait_until(
            lambda: (
                "reach.outbox_relay"
                in (tmp_path / "logs" / "worker.log").read_text(errors="replace")
            ),
            timeout=40,
            what="beat's ticks on the worker",
        )
    with sqlite3.connect(data / "agent-reach.db") as db:  # the store is the file it names
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"agents", "instances", "tasks"} <= tables


@pytest.mark.parametrize("command", ["api", "worker", "beat", "up"])
def test_each_command_reads_the_file_its_option_names(tmp_path: Path, command: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("router:\n  dead_letter: false\n", encoding="utf-8")
    env = hub_env("", tmp_path)
    env.pop("REACH_DATABASE_URL")
    done = subprocess.run(
        [sys.executable, "-m", "reach", command, "--config", str(config)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "invalid setting router.dead_letter" in said
    assert "dead letters cannot be turned off" in said
