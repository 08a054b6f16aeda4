"""Typed settings: defaults < ``config.yaml`` (``REACH_CONFIG``) < ``REACH_*`` environment.

One object, validated once at start-up and passed explicitly. A bad value stops
start-up with a ``ConfigError`` that names the key (``server.port``,
``REACH_DATABASE_URL`` …), never a traceback from deep inside a library.

Environment names: the documented shortcuts ``REACH_DATABASE_URL``,
``REACH_BROKER_URL``, ``REACH_RESULT_BACKEND``, ``REACH_HOME`` and, for any nested
key, ``REACH_<SECTION>__<KEY>`` (e.g. ``REACH_SERVER__PORT=9000``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reach.errors import ConfigError

ENV_PREFIX = "REACH_"
_SHORTCUTS = {
    "REACH_DATABASE_URL": ("storage", "database_url"),
    "REACH_BROKER_URL": ("storage", "broker_url"),
    "REACH_RESULT_BACKEND": ("storage", "result_backend"),
    "REACH_HOME": ("storage", "home"),
}
# Read by other parts of the system, not settings keys.
_NOT_SETTINGS = {"REACH_CONFIG", "REACH_HUB_URL"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8800, ge=1, le=65535)
    admin_port: int | None = Field(None, ge=1, le=65535)
    max_body_bytes: int = Field(1_048_576, ge=1024)

    @field_validator("port", "admin_port", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a port is a number, not a boolean")
        return value

    @field_validator("admin_port")
    @classmethod
    def _ports_differ(cls, value: int | None, info: ValidationInfo) -> int | None:
        # A field validator (not a model validator) so the error is located at admin_port.
        if value is not None and value == info.data.get("port"):
            raise ValueError("admin_port must differ from port")
        return value


class StorageSettings(_Section):
    home: str = ".reach"
    database_url: str | None = None
    broker_url: str | None = None
    result_backend: str | None = None

    @property
    def home_path(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home_path / 'reach.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.home_path / 'broker.db'}"

    @property
    def resolved_result_backend(self) -> str:
        if self.result_backend:
            return self.result_backend
        broker = self.resolved_broker_url
        if broker.startswith(("redis://", "rediss://")):
            return broker
        return f"db+sqlite:///{self.home_path / 'results.db'}"

    @property
    def is_embedded(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")


class HeartbeatSettings(_Section):
    default_interval: float = Field(10.0, gt=0, le=3600)
    missed_intervals: int = Field(3, ge=1, le=100)
    sweep_interval: float = Field(5.0, gt=0, le=3600)
    lost_grace: float = Field(
        60.0, ge=0, description="heartbeat lost, probes fine: alert this long"
    )
    degraded_rise_streak: int = Field(3, ge=1, description="in_flight rises before DEGRADED")


class ProbeSettings(_Section):
    interval: float = Field(5.0, gt=0)
    fast_interval: float = Field(1.0, gt=0)
    retry_interval: float = Field(30.0, gt=0)
    fail_threshold: int = Field(3, ge=1)
    window: int = Field(10, ge=1, le=1000)
    max_concurrent: int = Field(8, ge=1, le=1024)
    timeout: float = Field(2.0, gt=0)
    fast_below_score: float = Field(60.0, ge=0, le=100)
    fresh: float = Field(15.0, gt=0, description="a probe older than this is no evidence")


class RouterSettings(_Section):
    max_retry: int = Field(5, ge=0, le=100)
    backoff_base: float = Field(1.0, gt=0)
    backoff_cap: float = Field(30.0, gt=0)
    connect_timeout: float = Field(2.0, gt=0)
    read_timeout: float = Field(30.0, gt=0)
    failure_threshold: int = Field(3, ge=1, description="consecutive failures out of the pool")
    watchdog_grace: float = Field(30.0, ge=0, description="202 tasks: silence allowed past timeout")
    republish_grace: float = Field(
        10.0, gt=0, description="overdue this long: message presumed lost"
    )
    # per-instance circuit breaker (reach.core.breaker); min_volume 0 disables opening
    breaker_window: int = Field(10, ge=1, le=3600, description="seconds of outcomes counted")
    breaker_failure_ratio: float = Field(
        0.5, ge=0, lt=1, description="failure share (strictly above) that opens the breaker"
    )
    breaker_min_volume: int = Field(
        20, ge=0, description="outcomes needed in the window before it may open; 0 disables"
    )
    breaker_trial_interval: float = Field(
        30.0, gt=0, le=86400, description="open breaker: one trial request this often"
    )
    candidate_ttl: float = Field(
        0.5, ge=0, le=10, description="a worker reuses routing candidates this long; 0: never"
    )

    @field_validator("backoff_cap")
    @classmethod
    def _cap_not_below_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("backoff_base")
        if base is not None and value < base:
            raise ValueError("backoff_cap must not be below backoff_base")
        return value


class ScoreSettings(_Section):
    """ReachScore weights and bounds; validated by ``reach.core.scoring.ScoreConfig``."""

    heartbeat_weight: float = 50.0
    rtt_weight: float = 30.0
    loss_weight: float = 20.0
    heartbeat_good_s: float = 10.0
    heartbeat_bad_s: float = 30.0
    rtt_good_ms: float = 20.0
    rtt_bad_ms: float = 500.0
    loss_good: float = 0.0
    loss_bad: float = 0.30

    @model_validator(mode="after")
    def _valid_score(self) -> ScoreSettings:
        from reach.core.scoring import ScoreConfig, ScoreConfigError

        try:
            ScoreConfig(**self.model_dump())
        except ScoreConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


class Settings(_Section):
    server: ServerSettings = ServerSettings()
    storage: StorageSettings = StorageSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    probe: ProbeSettings = ProbeSettings()
    router: RouterSettings = RouterSettings()
    score: ScoreSettings = ScoreSettings()


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings from file and environment; raise ``ConfigError`` naming the key."""
    env = os.environ if environ is None else environ
    path = config_path or env.get("REACH_CONFIG")
    data: dict[str, Any] = _read_yaml(Path(path)) if path else {}
    sources: dict[tuple[str, ...], str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
            continue
        if name in _SHORTCUTS:
            keys: tuple[str, ...] = _SHORTCUTS[name]
        elif "__" in name:
            keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        else:
            continue  # unrelated REACH_* variables (e.g. used by tests) are left alone
        _set_path(data, keys, value, name)
        sources[keys] = name
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        keys = tuple(str(p) for p in first["loc"])
        label = _source_of(keys, sources) or ".".join(keys) or "<root>"
        raise ConfigError(f"invalid setting {label}: {first['msg']}", key=label) from None


def _source_of(keys: tuple[str, ...], sources: dict[tuple[str, ...], str]) -> str | None:
    """The environment variable behind the failing key, also when it set a key below it."""
    if keys in sources:
        return sources[keys]
    below = [name for path, name in sources.items() if keys and path[: len(keys)] == keys]
    return below[0] if len(below) == 1 else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", key="REACH_CONFIG") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}", key="REACH_CONFIG") from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"config file {path} is not valid YAML: {exc}", key="REACH_CONFIG"
        ) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections", key="REACH_CONFIG")
    return loaded


def _set_path(data: dict[str, Any], keys: tuple[str, ...], value: str, source: str) -> None:
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source} sets a key below a non-section value", key=source)
        node = child
    node[keys[-1]] = value
