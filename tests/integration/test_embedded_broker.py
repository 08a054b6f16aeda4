"""The embedded broker when another process declares the same queue first (the API,
the worker and beat all declare at start-up; kombu's own guard is per process)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from kombu import Connection


def test_losing_the_queue_creation_race_reads_the_winners_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    with Connection(url, transport="reach.worker.embedded_broker:Transport") as conn:
        channel: Any = conn.default_channel
        channel._get_or_create("warm-up")  # creates the tables
        # another process wins the race: its row lands between our lookup and our insert
        with sqlite3.connect(tmp_path / "broker.db") as other:
            other.execute("INSERT INTO kombu_queue (name) VALUES ('reach')")
        real_query = channel.session.query
        lookups = {"n": 0}

        def racing_query(*args: Any, **kwargs: Any) -> Any:
            lookups["n"] += 1
            query = real_query(*args, **kwargs)
            return query.filter(sqlalchemy.false()) if lookups["n"] <= 2 else query

        monkeypatch.setattr(channel.session, "query", racing_query)
        queue = channel._get_or_create("reach")
        assert queue.name == "reach"
        assert lookups["n"] == 3  # two misses (kombu's), then our re-read after the conflict
