"""Tables for ``load_settings``: defaults < config.yaml < REACH_* environment, bad keys named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reach.errors import ConfigError
from reach.hub.settings import Settings, load_settings


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def dig(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# -- defaults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("server.host", "127.0.0.1"),
        ("server.port", 8800),
        ("server.admin_port", None),
        ("storage.database_url", None),
        ("storage.broker_url", None),
        ("storage.result_backend", None),
        ("storage.pool_size", 20),
        ("storage.max_overflow", 10),
        ("heartbeat.default_interval", 10.0),
        ("heartbeat.missed_intervals", 3),
        ("probe.interval", 5.0),
        ("router.max_retry", 5),
        ("router.breaker_window", 10),
        ("router.breaker_failure_ratio", 0.5),
        ("router.breaker_min_volume", 20),
        ("router.breaker_trial_interval", 30.0),
    ],
)
def test_defaults(key: str, expected: Any) -> None:
    assert dig(load_settings(environ={}), key) == expected


def test_default_home_is_dot_reach_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    storage = load_settings(environ={}).storage
    home = tmp_path.resolve() / ".reach"
    assert storage.home_path == home
    assert storage.resolved_database_url == f"sqlite:///{home / 'reach.db'}"


@pytest.mark.parametrize(
    ("attr", "expected"),
    [
        ("resolved_database_url", "sqlite:///{home}/reach.db"),
        ("resolved_broker_url", "sqla+sqlite:///{home}/broker.db"),
        ("resolved_result_backend", "db+sqlite:///{home}/results.db"),
        ("is_embedded", True),
    ],
)
def test_embedded_urls_live_under_reach_home(tmp_path: Path, attr: str, expected: Any) -> None:
    storage = load_settings(environ={"REACH_HOME": str(tmp_path)}).storage
    home = tmp_path.resolve()
    if isinstance(expected, str):
        expected = expected.format(home=home)
    assert getattr(storage, attr) == expected


@pytest.mark.parametrize(
    ("environ", "broker", "backend"),
    [
        ({"REACH_BROKER_URL": "redis://r:6379/0"}, "redis://r:6379/0", "redis://r:6379/0"),
        ({"REACH_BROKER_URL": "rediss://r:6380/1"}, "rediss://r:6380/1", "rediss://r:6380/1"),
        (
            {"REACH_BROKER_URL": "redis://r:6379/0", "REACH_RESULT_BACKEND": "redis://r:6379/2"},
            "redis://r:6379/0",
            "redis://r:6379/2",
        ),
        (
            {"REACH_BROKER_URL": "amqp://guest@mq//"},
            "amqp://guest@mq//",
            "db+sqlite:///{home}/results.db",
        ),
        (
            {"REACH_RESULT_BACKEND": "db+postgresql+psycopg://u@h/db"},
            "sqla+sqlite:///{home}/broker.db",
            "db+postgresql+psycopg://u@h/db",
        ),
    ],
)
def test_result_backend_follows_a_redis_broker(
    tmp_path: Path, environ: dict[str, str], broker: str, backend: str
) -> None:
    storage = load_settings(environ={"REACH_HOME": str(tmp_path), **environ}).storage
    home = tmp_path.resolve()
    assert storage.resolved_broker_url == broker.format(home=home)
    assert storage.resolved_result_backend == backend.format(home=home)


def test_a_database_url_that_is_not_sqlite_is_not_embedded() -> None:
    storage = load_settings(environ={"REACH_DATABASE_URL": "postgresql+psycopg://u@h/reach"})
    assert storage.storage.resolved_database_url == "postgresql+psycopg://u@h/reach"
    assert not storage.storage.is_embedded


# -- the config file -----------------------------------------------------------------------

FULL_CONFIG = """\
server:
  host: 0.0.0.0
  port: 9000
  admin_port: 9001
storage:
  database_url: postgresql+psycopg://u@db/reach
  broker_url: redis://redis:6379/0
probe:
  interval: 2.5
  fail_threshold: 5
router:
  max_retry: 2
  read_timeout: 12
heartbeat:
  default_interval: 4
  missed_intervals: 5
"""


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("server.host", "0.0.0.0"),
        ("server.port", 9000),
        ("server.admin_port", 9001),
        ("storage.database_url", "postgresql+psycopg://u@db/reach"),
        ("storage.resolved_broker_url", "redis://redis:6379/0"),
        ("storage.resolved_result_backend", "redis://redis:6379/0"),
        ("probe.interval", 2.5),
        ("probe.fail_threshold", 5),
        ("probe.timeout", 2.0),  # a key the file leaves out keeps its default
        ("router.max_retry", 2),
        ("router.read_timeout", 12.0),
        ("heartbeat.default_interval", 4.0),
        ("heartbeat.missed_intervals", 5),
    ],
)
def test_config_file_sections(tmp_path: Path, key: str, expected: Any) -> None:
    settings = load_settings(write_config(tmp_path, FULL_CONFIG), environ={})
    assert dig(settings, key) == expected


def test_config_file_is_found_through_reach_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, "server:\n  port: 9100\n")
    assert load_settings(environ={"REACH_CONFIG": str(path)}).server.port == 9100


def test_explicit_config_path_wins_over_reach_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, "server:\n  port: 9100\n")
    settings = load_settings(path, environ={"REACH_CONFIG": str(tmp_path / "absent.yaml")})
    assert settings.server.port == 9100


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_an_empty_config_file_means_defaults(tmp_path: Path, text: str) -> None:
    assert load_settings(write_config(tmp_path, text), environ={}) == load_settings(environ={})


# -- the environment -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "key", "expected"),
    [
        ("REACH_DATABASE_URL", "postgresql+psycopg://env/db", "storage.database_url", None),
        ("REACH_BROKER_URL", "redis://env:6379/3", "storage.broker_url", None),
        ("REACH_RESULT_BACKEND", "redis://env:6379/4", "storage.result_backend", None),
        ("REACH_SERVER__PORT", "9500", "server.port", 9500),
        ("REACH_SERVER__HOST", "10.0.0.1", "server.host", None),
        ("REACH_PROBE__INTERVAL", "0.5", "probe.interval", 0.5),
        ("REACH_HEARTBEAT__MISSED_INTERVALS", "7", "heartbeat.missed_intervals", 7),
        ("REACH_ROUTER__BREAKER_MIN_VOLUME", "0", "router.breaker_min_volume", 0),
        ("REACH_ROUTER__BREAKER_TRIAL_INTERVAL", "2.5", "router.breaker_trial_interval", 2.5),
        ("reach_server__port", "9501", "server.port", 9000),  # the prefix is case-sensitive
    ],
)
def test_environment_overrides_the_file(
    tmp_path: Path, name: str, value: str, key: str, expected: Any
) -> None:
    path = write_config(tmp_path, FULL_CONFIG)
    settings = load_settings(path, environ={name: value})
    assert dig(settings, key) == (value if expected is None else expected)


@pytest.mark.parametrize(
    "environ",
    [
        {"REACH_HUB_URL": "http://hub:8800"},
        {"REACH_TEST_SOMETHING": "1"},
        {"REACH_PORT": "not-a-port"},
        {"REACH_": "x"},
        {"REACH_CONFIG": ""},
        {"OTHER_SERVER__PORT": "1"},
        {"PATH": "/usr/bin"},
    ],
)
def test_unrelated_environment_is_ignored(environ: dict[str, str]) -> None:
    assert load_settings(environ=environ) == load_settings(environ={})


# -- errors name the key -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "environ", "key", "words"),
    [
        ("server:\n  port: abc\n", {}, "server.port", "integer"),
        ("server:\n  port: 80.5\n", {}, "server.port", "integer"),
        ("server:\n  port: [1]\n", {}, "server.port", "integer"),
        ("server:\n  port: 0\n", {}, "server.port", "greater than or equal to 1"),
        ("server:\n  port: 65536\n", {}, "server.port", "less than or equal to 65535"),
        ("server:\n  admin_port: 0\n", {}, "server.admin_port", "greater than"),
        ("server:\n  max_body_bytes: 10\n", {}, "server.max_body_bytes", "1024"),
        ("server:\n  bogus: 1\n", {}, "server.bogus", "Extra inputs"),
        ("storage:\n  database: x\n", {}, "storage.database", "Extra inputs"),
        ("probe:\n  interval: 0\n", {}, "probe.interval", "greater than 0"),
        ("probe:\n  window: 0\n", {}, "probe.window", "greater than"),
        ("router:\n  max_retry: -1\n", {}, "router.max_retry", "greater than"),
        ("heartbeat:\n  missed_intervals: 0\n", {}, "heartbeat.missed_intervals", "greater"),
        ("heartbeat:\n  colour: red\n", {}, "heartbeat.colour", "Extra inputs"),
        ("bogus:\n  x: 1\n", {}, "bogus", "Extra inputs"),
        ("server: 5\n", {}, "server", "dictionary"),
        ("", {"REACH_SERVER__PORT": "abc"}, "REACH_SERVER__PORT", "integer"),
        ("", {"REACH_SERVER__PORT": "0"}, "REACH_SERVER__PORT", "greater"),
        ("", {"REACH_SERVER__PORT": "70000"}, "REACH_SERVER__PORT", "less"),
        ("", {"REACH_SERVER__BOGUS": "1"}, "REACH_SERVER__BOGUS", "Extra inputs"),
        ("router:\n  breaker_window: 0\n", {}, "router.breaker_window", "greater than"),
        ("router:\n  breaker_failure_ratio: 1\n", {}, "router.breaker_failure_ratio", "less"),
        ("router:\n  breaker_min_volume: -1\n", {}, "router.breaker_min_volume", "greater"),
        (
            "",
            {"REACH_ROUTER__BREAKER_TRIAL_INTERVAL": "0"},
            "REACH_ROUTER__BREAKER_TRIAL_INTERVAL",
            "greater than 0",
        ),
        ("server: 5\n", {"REACH_SERVER__PORT": "1"}, "REACH_SERVER__PORT", "non-section"),
        ("server:\n  port: 9000\n", {"REACH_SERVER__PORT": "x"}, "REACH_SERVER__PORT", "integer"),
    ],
)
def test_bad_setting_raises_config_error_naming_the_key(
    tmp_path: Path, config: str, environ: dict[str, str], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, config), environ=environ)
    assert caught.value.extra["key"] == key
    assert key in str(caught.value)
    assert words in str(caught.value)


def test_boolean_port_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, "server:\n  port: true\n"), environ={})
    assert caught.value.extra["key"] == "server.port"


@pytest.mark.parametrize(
    ("config", "environ"),
    [
        ("server:\n  port: 9000\n  admin_port: 9000\n", {}),
        ("server:\n  admin_port: 8800\n", {}),
    ],
)
def test_admin_port_equal_to_port_is_refused(
    tmp_path: Path, config: str, environ: dict[str, str]
) -> None:
    with pytest.raises(ConfigError, match="admin_port must differ from port") as caught:
        load_settings(write_config(tmp_path, config), environ=environ)
    # The error is raised by a model validator of the whole section, so the key is the
    # section; see test_admin_port_clash_names_the_admin_port_key for the stricter wish.
    assert caught.value.extra["key"] in {"server", "server.admin_port"}


@pytest.mark.parametrize(
    ("config", "environ", "key"),
    [
        ("server:\n  port: 9000\n  admin_port: 9000\n", {}, "server.admin_port"),
        ("", {"REACH_SERVER__ADMIN_PORT": "8800"}, "REACH_SERVER__ADMIN_PORT"),
    ],
)
def test_admin_port_clash_names_the_admin_port_key(
    tmp_path: Path, config: str, environ: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, config), environ=environ)
    assert caught.value.extra["key"] == key


def test_unknown_section_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"REACH_BOGUS__X": "1"})
    assert caught.value.extra["key"] == "REACH_BOGUS__X"


def test_unknown_section_from_the_environment_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"(?i)bogus"):
        load_settings(environ={"REACH_BOGUS__X": "1"})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("server: [\n", "not valid YAML"),
        ("server:\n  port: 1\n bad-indent: 2\n", "not valid YAML"),
        ("- server\n- storage\n", "must hold a mapping"),
        ("just a string\n", "must hold a mapping"),
        ("42\n", "must hold a mapping"),
    ],
)
def test_bad_config_file_content(tmp_path: Path, text: str, words: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=words) as caught:
        load_settings(path, environ={})
    assert caught.value.extra["key"] == "REACH_CONFIG"
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("via_environ", [False, True])
def test_missing_config_file(tmp_path: Path, via_environ: bool) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="not found") as caught:
        if via_environ:
            load_settings(environ={"REACH_CONFIG": str(path)})
        else:
            load_settings(path, environ={})
    assert caught.value.extra["key"] == "REACH_CONFIG"
    assert str(path) in str(caught.value)


def test_config_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path, environ={})
    assert caught.value.extra["key"] == "REACH_CONFIG"


def test_settings_are_frozen() -> None:
    settings = load_settings(environ={})
    with pytest.raises(ValueError, match="frozen"):
        settings.server.port = 1  # type: ignore[misc]
