"""Seed 000's ``config.yaml`` starts a hub as written: human durations for every duration
setting, ``storage.type`` + ``storage.path`` for the store, ``router.dead_letter``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reach.errors import ConfigError
from reach.hub.settings import Settings, load_settings

# The article's file (§4.1), with the data directory moved under the test's own.
SEED_CONFIG = """\
server:
  port: 8900
  admin_port: 8800
storage:
  type: sqlite # 可选 etcd
  path: {data}/agent-reach.db
probe:
  interval: 5s
  fail_threshold: 3
  retry_interval: 30s
router:
  max_retry: 5
  dead_letter: true
"""


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ=environ or {})


def test_the_seed_config_loads_as_written(tmp_path: Path) -> None:
    s = load(tmp_path, SEED_CONFIG.format(data=tmp_path / "data"))
    assert (s.server.port, s.server.admin_port) == (8900, 8800)
    assert s.storage.resolved_database_url == f"sqlite:///{tmp_path / 'data' / 'agent-reach.db'}"
    assert s.storage.is_embedded
    assert (s.probe.interval, s.probe.fail_threshold, s.probe.retry_interval) == (5.0, 3, 30.0)
    assert (s.router.max_retry, s.router.dead_letter) == (5, True)


@pytest.mark.parametrize(
    ("section", "key", "written", "expected"),
    [
        ("probe", "interval", "250ms", 0.25),
        ("probe", "timeout", "2s", 2.0),
        ("heartbeat", "default_interval", "10s", 10.0),
        ("heartbeat", "lost_grace", "1m", 60.0),
        ("router", "backoff_cap", "30s", 30.0),
        ("router", "read_timeout", "2m", 120.0),
        ("router", "breaker_window", "10s", 10),
        ("router", "retry_budget_window", "20s", 20),
        ("router", "loop_alert_window", "5m", 300.0),
        ("score", "rtt_bad_ms", "500ms", 500.0),  # a milliseconds setting
        ("score", "heartbeat_bad_s", "30s", 30.0),
        ("retention", "days", "12h", 0.5),  # a days setting
        ("retention", "offline_instance_hours", "1d", 24.0),  # an hours setting
        ("security", "token_ttl_s", "5m", 300.0),
        ("approval", "timeout_s", "1h", 3600.0),
        ("sessions", "max_ttl_s", "7d", 7 * 86400.0),
        ("callbacks", "timeout_s", "5s", 5.0),
        ("exchanges", "lease_s", "15s", 15.0),
        ("a2a", "poll_interval_s", "1s", 1.0),
        ("beat", "lock_lease_s", "15s", 15.0),
        ("dags", "sweep_margin", "30s", 30.0),
        ("server", "stream_ping_s", "15s", 15.0),
        ("probe", "interval", "7", 7.0),  # a bare number keeps the setting's unit
    ],
)
def test_every_duration_takes_a_unit(
    tmp_path: Path, section: str, key: str, written: str, expected: Any
) -> None:
    s = load(tmp_path, f"{section}:\n  {key}: {written}\n")
    assert getattr(getattr(s, section), key) == expected
    # the same through the environment
    env = load_settings(environ={f"REACH_{section.upper()}__{key.upper()}": written})
    assert getattr(getattr(env, section), key) == expected


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("probe:\n  interval: 5 s\n", "probe.interval", "is no duration"),
        ("probe:\n  interval: -5s\n", "probe.interval", "is no duration"),
        ("probe:\n  interval: 0s\n", "probe.interval", "greater than 0"),
        ("router:\n  breaker_window: 1500ms\n", "router.breaker_window", "integer"),
        ("router:\n  dead_letter: false\n", "router.dead_letter", "cannot be turned off"),
        ("storage:\n  type: etcd\n", "storage.type", "sqlite"),
        ("storage:\n  type: postgres\n", "storage", "database_url"),
        (
            "storage:\n  type: postgres\n  path: /tmp/x.db\n"
            "  database_url: postgresql+psycopg://u@h/d\n",
            "storage",
            "storage.path names a SQLite file",
        ),
        (
            "storage:\n  path: /tmp/x.db\n  database_url: postgresql+psycopg://u@h/d\n",
            "storage",
            "not both",
        ),
    ],
)
def test_what_the_file_may_not_say(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert caught.value.extra["key"] == key
    assert f"invalid setting {key}:" in str(caught.value)
    assert words in str(caught.value)


def test_storage_type_postgres_with_its_url(tmp_path: Path) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    s = load(tmp_path, f"storage:\n  type: postgres\n  database_url: {url}\n")
    assert (s.storage.type, s.storage.resolved_database_url) == ("postgres", url)
    assert not s.storage.is_embedded


def test_a_path_alone_is_a_sqlite_file(tmp_path: Path) -> None:
    s = load(tmp_path, f"storage:\n  path: {tmp_path}/hub.db\n")
    assert s.storage.resolved_database_url == f"sqlite:///{tmp_path}/hub.db"
