"""``Settings`` is a pydantic-settings ``BaseSettings``: arguments > environment > file > defaults.

``tests/unit/test_settings.py`` holds the ``load_settings`` contract; these tables pin what
the pydantic-settings sources add to it and where they are stricter than the stock ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reach.errors import ConfigError
from reach.hub.settings import Settings, load_settings


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """``os.environ`` without any REACH_* variable of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("REACH_"):
            monkeypatch.delenv(name)
    return monkeypatch


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# -- precedence ----------------------------------------------------------------------------

PRECEDENCE_CONFIG = "server:\n  host: 10.0.0.9\n  port: 9000\n  admin_port: 9001\n"


@pytest.mark.parametrize(
    ("environ_values", "init", "expected"),
    [
        ({}, {}, (9000, 9001, "10.0.0.9")),  # the file over the defaults
        ({"REACH_SERVER__PORT": "9500"}, {}, (9500, 9001, "10.0.0.9")),  # env over the file
        (  # arguments over env, key by key: what neither sets falls through
            {"REACH_SERVER__PORT": "9500", "REACH_SERVER__ADMIN_PORT": "9502"},
            {"server": {"port": 9600}},
            (9600, 9502, "10.0.0.9"),
        ),
    ],
)
def test_arguments_beat_environment_beat_file_beat_defaults(
    tmp_path: Path,
    environ: pytest.MonkeyPatch,
    environ_values: dict[str, str],
    init: dict[str, dict[str, int]],
    expected: tuple[int, int, str],
) -> None:
    environ.setenv("REACH_CONFIG", str(write_config(tmp_path, PRECEDENCE_CONFIG)))
    for name, value in environ_values.items():
        environ.setenv(name, value)
    server = Settings(**init).server  # type: ignore[arg-type]
    assert (server.port, server.admin_port, server.host) == expected
    assert server.max_body_bytes == 1_048_576  # set nowhere: the default


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"REACH_SERVER__PORT": "9500", "REACH_PROBE__INTERVAL": "0.5"},
        {"REACH_DATABASE_URL": "postgresql+psycopg://u@h/reach", "REACH_HOME": "/srv/reach"},
        {"REACH_HUB_URL": "http://hub:8800", "REACH_TEST_SOMETHING": "1"},
    ],
)
def test_settings_reads_os_environ_as_load_settings_does(
    environ: pytest.MonkeyPatch, values: dict[str, str]
) -> None:
    for name, value in values.items():
        environ.setenv(name, value)
    assert Settings() == load_settings() == load_settings(environ=values)


def test_load_settings_reads_only_the_environ_it_is_given(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("REACH_SERVER__PORT", "9500")
    assert load_settings(environ={}).server.port == 8800


# -- the stricter environment source -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key", "words"),
    [
        ("REACH_PROBE__INTERVALL", "REACH_PROBE__INTERVALL", "Extra inputs"),  # nested typo
        ("REACH_ROUTER__MAX_RETRIES", "REACH_ROUTER__MAX_RETRIES", "Extra inputs"),
        ("REACH_SERVER__PORT__X", "REACH_SERVER__PORT__X", "integer"),  # below a value
        ("REACH_PROBES__INTERVAL", "REACH_PROBES__INTERVAL", "Extra inputs"),  # unknown section
    ],
)
def test_unknown_environment_keys_are_refused_by_name(name: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={name: "1"})
    assert caught.value.extra["key"] == key
    assert words in str(caught.value)


def test_unknown_file_key_is_named_as_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Extra inputs") as caught:
        load_settings(write_config(tmp_path, "probe:\n  intervall: 1\n"), environ={})
    assert caught.value.extra["key"] == "probe.intervall"


def test_the_name_after_the_prefix_is_not_case_sensitive() -> None:
    assert load_settings(environ={"REACH_Server__Port": "9700"}).server.port == 9700


@pytest.mark.parametrize(
    "environ_values",
    [
        {"REACH_SERVER": '{"port": 1}'},  # the stock source would decode this JSON
        {"REACH_STORAGE": '{"home": "/elsewhere"}'},
    ],
)
def test_a_whole_section_in_one_variable_is_no_setting(environ_values: dict[str, str]) -> None:
    assert load_settings(environ=environ_values) == load_settings(environ={})


# -- Settings() keeps the start-up guards --------------------------------------------------


def test_settings_refuses_a_missing_config_file(
    tmp_path: Path, environ: pytest.MonkeyPatch
) -> None:
    environ.setenv("REACH_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="not found") as caught:
        Settings()
    assert caught.value.extra["key"] == "REACH_CONFIG"


def test_settings_refuses_a_key_below_a_file_value(
    tmp_path: Path, environ: pytest.MonkeyPatch
) -> None:
    environ.setenv("REACH_CONFIG", str(write_config(tmp_path, "server: 5\n")))
    environ.setenv("REACH_SERVER__PORT", "1")
    with pytest.raises(ConfigError, match="non-section") as caught:
        Settings()
    assert caught.value.extra["key"] == "REACH_SERVER__PORT"


def test_a_dotenv_file_is_not_read(tmp_path: Path, environ: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("REACH_SERVER__PORT=9999\n", encoding="utf-8")
    environ.chdir(tmp_path)
    assert Settings().server.port == 8800
