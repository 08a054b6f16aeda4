"""The embedded broker when another process creates its tables or declares the same queue
first (the API, the worker and beat all open it at start-up; kombu's own guard is per
process)."""

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


def test_losing_the_table_creation_race_opens_the_broker_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's create_all made a table between ours checking and creating it: a
    worker took that for a lost broker connection (tests/faults/test_embedded_load.py)."""
    from kombu.transport import sqlalchemy as kombu_sqla

    from reach.worker.embedded_broker import Channel

    real_create_all = kombu_sqla.metadata.create_all
    calls = {"n": 0}

    def racing_create_all(engine: Any, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        real_create_all(engine, *args, **kwargs)
        if calls["n"] == 1:  # the other process's table landed first
            raise sqlalchemy.exc.OperationalError(
                "CREATE TABLE kombu_queue",
                {},
                sqlite3.OperationalError("table kombu_queue already exists"),
            )

    monkeypatch.setattr(kombu_sqla.metadata, "create_all", racing_create_all)
    monkeypatch.setattr(Channel, "_engines", {})  # this process has not opened it yet
    url = f"sqlite:///{tmp_path}/broker.db"
    with Connection(url, transport="reach.worker.embedded_broker:Transport") as conn:
        producer = conn.Producer()
        producer.publish({"n": 1}, routing_key="reach", declare=[conn.SimpleQueue("reach").queue])
        assert conn.SimpleQueue("reach").get(timeout=5).payload == {"n": 1}
    assert calls["n"] == 2  # lost once, then opened again
