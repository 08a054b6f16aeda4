"""Typed settings: defaults < ``config.yaml`` (``REACH_CONFIG``) < ``REACH_*`` environment.

Built on pydantic-settings: ``Settings`` is a ``BaseSettings`` whose sources are, from
strongest to weakest, constructor arguments, the environment, the YAML file and the
field defaults. ``load_settings`` is the start-up entry point: it takes the file and the
environment explicitly (tests pass their own), validates once, and turns a bad value
into a ``ConfigError`` that names the key as the user wrote it (``server.port`` in the
file, ``REACH_SERVER__PORT`` in the environment …), never a traceback from deep inside
a library. The object is then passed explicitly.

Environment names: the documented shortcuts ``REACH_DATABASE_URL``,
``REACH_BROKER_URL``, ``REACH_RESULT_BACKEND``, ``REACH_HOME`` and, for any nested
key, ``REACH_<SECTION>__<KEY>`` (e.g. ``REACH_SERVER__PORT=9000``). The prefix is
case-sensitive, the rest is not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from reach.core.ops.durations import DurationError, in_unit
from reach.errors import ConfigError

ENV_PREFIX = "REACH_"
_NESTED = "__"
_SHORTCUTS = {
    "REACH_DATABASE_URL": ("storage", "database_url"),
    "REACH_BROKER_URL": ("storage", "broker_url"),
    "REACH_RESULT_BACKEND": ("storage", "result_backend"),
    "REACH_HOME": ("storage", "home"),
    "REACH_LOG_FORMAT": ("logging", "format"),
}
# Read by other parts of the system, not settings keys.
_NOT_SETTINGS = {"REACH_CONFIG", "REACH_HUB_URL"}


def _duration(unit_s: float) -> BeforeValidator:
    """A setting in ``unit_s`` seconds that also takes a human duration ("5s", "250ms")."""

    def convert(value: object) -> object:
        try:
            return in_unit(value, unit_s)
        except DurationError as exc:
            raise ValueError(str(exc)) from None

    return BeforeValidator(convert)


# Duration settings: a number in the field's unit, or a string with a unit (seed 000's
# config.yaml writes ``probe.interval: 5s``).
Seconds = Annotated[float, _duration(1.0)]
WholeSeconds = Annotated[int, _duration(1.0)]
Millis = Annotated[float, _duration(0.001)]
Hours = Annotated[float, _duration(3600.0)]
Days = Annotated[float, _duration(86400.0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="address the API listens on")
    port: int = Field(
        8800, ge=1, le=65535, description="port of the API (and, unless admin_port, admin)"
    )
    admin_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="admin API and metrics on a port of their own; unset: port",
    )
    max_body_bytes: int = Field(
        1_048_576,
        ge=1024,
        description="request body limit (413); never below router.max_payload_bytes + 64 KiB",
    )
    # memory admission (issue 14): above this share of the API process's memory limit,
    # new submits answer 503 with Retry-After; the limit is the cgroup's unless set
    memory_admission_ratio: float = Field(
        0.8, gt=0, le=1, description="share of the memory limit past which submits wait"
    )
    memory_limit_bytes: int | None = Field(
        None, ge=1 << 20, description="the API process's memory limit; unset: the cgroup's"
    )
    stream_ping_s: Seconds = Field(
        15.0, gt=0, le=300, description="keep-alive comment on an idle progress stream"
    )
    # the API's edge (reach.hub.api.edge): limits a client meets before any route
    max_header_bytes: int = Field(
        65_536, ge=8192, le=1 << 20, description="request line plus headers (431 past it)"
    )
    max_headers: int = Field(100, ge=16, le=10_000, description="headers per request (431)")
    header_timeout_s: float = Field(
        10.0, gt=0, le=300, description="a request's head must arrive this soon, else closed"
    )
    max_connections: int = Field(
        4096, ge=16, le=1_000_000, description="connections per listener (503 past it)"
    )

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
    home: str = Field(".reach", description="folder of the embedded store, keys and logs")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; unset: SQLite in storage.home"
    )
    # seed 000's form: ``type: sqlite`` with ``path`` (the database file), or
    # ``type: postgres`` with database_url; database_url alone says both
    type: str | None = Field(None, description="sqlite or postgres; unset: from database_url")
    path: str | None = Field(None, description="the SQLite database file (type: sqlite)")
    broker_url: str | None = Field(
        None, description="Celery broker (redis:// or amqp://); unset: the embedded broker"
    )
    result_backend: str | None = Field(
        None, description="Celery result backend of DAG canvases; unset: the store"
    )
    # each process's PostgreSQL connections kept open: the API answers up to 40 requests
    # at once on its thread pool, and a connection above the pool is opened for one
    # transaction and closed after it (a PostgreSQL backend started and torn down: more
    # CPU than the transaction). The overflow is the burst allowance above it.
    pool_size: int = Field(
        20, ge=1, le=500, description="PostgreSQL connections each process keeps open"
    )
    max_overflow: int = Field(
        10, ge=0, le=500, description="connections above pool_size opened for a burst"
    )

    @field_validator("type")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        if value is None:
            return None
        kind = value.strip().lower()
        if kind in ("postgresql", "postgres", "pg"):
            return "postgres"
        if kind != "sqlite":
            raise ValueError(
                f"{value!r} is not a store of this hub: sqlite (one machine, the default) or "
                "postgres (several hubs share it; set storage.database_url)"
            )
        return kind

    @model_validator(mode="after")
    def _type_agrees(self) -> StorageSettings:
        url = self.database_url
        if self.type == "postgres":
            if self.path is not None:
                raise ValueError(
                    "storage.path names a SQLite file; with type postgres set "
                    "storage.database_url (postgresql+psycopg://user@host/db)"
                )
            if url is None or not url.startswith("postgresql"):
                raise ValueError(
                    "storage.type postgres needs storage.database_url = postgresql+psycopg://..."
                )
        if (self.type == "sqlite" or self.path is not None) and url is not None:
            raise ValueError(
                "set either storage.database_url or storage.type sqlite with storage.path, not both"
            )
        if self.path is not None and not self.path.strip():
            raise ValueError("storage.path is empty")
        return self

    @property
    def home_path(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        if self.path is not None:
            return f"sqlite:///{Path(self.path).expanduser().resolve()}"
        return f"sqlite:///{self.home_path / 'reach.db'}"

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
    default_interval: Seconds = Field(
        10.0, gt=0, le=3600, description="an agent's heartbeat period unless it declares one"
    )
    missed_intervals: int = Field(
        3, ge=1, le=100, description="heartbeats missed in a row before an instance is offline"
    )
    sweep_interval: Seconds = Field(
        5.0, gt=0, le=3600, description="how often beat looks for missed heartbeats"
    )
    lost_grace: Seconds = Field(
        60.0, ge=0, description="heartbeat lost, probes fine: alert this long"
    )
    degraded_rise_streak: int = Field(3, ge=1, description="in_flight rises before DEGRADED")
    flush_s: Seconds = Field(
        1.0,
        ge=0,
        le=60,
        description="the API writes quiet heartbeats (an idle, online instance's) in one batch "
        "this often; 0 writes each at once",
    )


class ProbeSettings(_Section):
    interval: Seconds = Field(5.0, gt=0, description="probe period of a healthy instance")
    fast_interval: Seconds = Field(
        1.0, gt=0, description="probe period while the ReachScore is below fast_below_score"
    )
    retry_interval: Seconds = Field(
        30.0,
        gt=0,
        description="probe period of an offline instance; an unreachable one is probed "
        "again after fast_interval, doubling per failed probe up to this",
    )
    fail_threshold: int = Field(
        3, ge=1, description="failed probes in a row before an instance is unreachable"
    )
    window: int = Field(
        10, ge=1, le=1000, description="recent probes kept for RTT and loss (the ReachScore)"
    )
    max_concurrent: int = Field(8, ge=1, le=1024, description="probes in flight at once")
    timeout: Seconds = Field(2.0, gt=0, description="a probe not answered this soon failed")
    fast_below_score: float = Field(
        60.0, ge=0, le=100, description="ReachScore below which probes run fast; 0: never"
    )
    fresh: Seconds = Field(15.0, gt=0, description="a probe older than this is no evidence")


class RouterSettings(_Section):
    max_retry: int = Field(
        5, ge=0, le=100, description="retries of a task before it becomes a dead letter"
    )
    dead_letter: bool = Field(
        True, description="always on: a task out of retries is kept as a dead letter"
    )
    backoff_base: Seconds = Field(
        1.0, gt=0, description="first retry's backoff, doubled each retry, with full jitter"
    )
    backoff_cap: Seconds = Field(30.0, gt=0, description="longest backoff between retries")
    connect_timeout: Seconds = Field(
        2.0, gt=0, description="a delivery's TCP connect to an agent; past it, a retry"
    )
    read_timeout: Seconds | None = Field(
        None,
        gt=0,
        description="cap on one exchange with an agent, in seconds; unset: the task's own "
        "timeout_ms (an exchange holds no worker slot, so an agent may think that long)",
    )
    failure_threshold: int = Field(3, ge=1, description="consecutive failures out of the pool")
    watchdog_grace: Seconds = Field(
        30.0, ge=0, description="202 tasks: silence allowed past timeout"
    )
    republish_grace: Seconds = Field(
        10.0, gt=0, description="overdue this long: message presumed lost"
    )
    # per-instance circuit breaker (reach.core.flow.breakers); min_volume 0 disables opening
    breaker_window: WholeSeconds = Field(
        10, ge=1, le=3600, description="seconds of outcomes counted"
    )
    breaker_failure_ratio: float = Field(
        0.5, ge=0, lt=1, description="failure share (strictly above) that opens the breaker"
    )
    breaker_min_volume: int = Field(
        20, ge=0, description="outcomes needed in the window before it may open; 0 disables"
    )
    breaker_trial_interval: Seconds = Field(
        30.0, gt=0, le=86400, description="open breaker: one trial request this often"
    )
    breaker_recovery_windows: int = Field(
        3,
        ge=0,
        le=100,
        description="after a successful trial, windows over which the instance's share "
        "ramps up (a failure meanwhile reopens it); 0: whole share at once",
    )
    breaker_streak: int = Field(
        10,
        ge=0,
        description="distinct tasks failing in a row (within the window) that open the "
        "breaker at once, before the ratio would; 0: off",
    )
    candidate_ttl: Seconds = Field(
        0.5, ge=0, le=10, description="a worker reuses routing candidates this long; 0: never"
    )
    # flow control (issue 14, docs/guide/flow-control.md)
    max_queue: int = Field(
        1000, ge=1, le=10_000_000, description="pending + in-flight tasks per agent (429 past it)"
    )
    max_payload_bytes: int = Field(
        1_048_576, ge=256, description="a task's payload past this is refused (413): send a ref"
    )
    max_hops: int = Field(8, ge=1, le=64, description="a reach deeper than this is a loop (508)")
    retry_budget_ratio: float = Field(
        0.2, ge=0, le=10, description="retries toward a target: at most this share of requests"
    )
    retry_budget_min_per_s: float = Field(
        3.0, ge=0, description="retries per second a target always allows, whatever the ratio"
    )
    retry_budget_window: WholeSeconds = Field(
        20, ge=1, le=300, description="seconds of requests the retry budget counts (10-30)"
    )
    background_share: float = Field(
        0.5, gt=0, le=1, description="worker slots background tasks may hold while online waits"
    )
    background_defer_s: Seconds = Field(
        0.5, gt=0, le=60, description="seconds a background attempt yields to waiting online work"
    )
    background_max_wait_s: Seconds = Field(
        60.0, gt=0, le=3600, description="a background attempt deferred this long runs anyway"
    )
    loop_alert_threshold: int = Field(
        20, ge=1, description="reaches each way between two agents in the window: loop suspected"
    )
    loop_alert_window: Seconds = Field(
        300.0, gt=0, le=86400, description="seconds of reaches the dependency-loop alert counts"
    )
    # semantic capability matching (reach.core.fleet.matching, reach.hub.fleet.matching)
    semantic: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on when agent-reach[semantic] is installed; on: required"
    )
    semantic_threshold: float = Field(
        0.5, ge=0, le=1, description="cosine similarity below which an intent finds no agent"
    )
    semantic_margin: float = Field(
        0.03, ge=0, le=1, description="similarities this close are equally apt: health decides"
    )
    semantic_model: str | None = Field(
        None,
        description="a local sentence-transformers model folder (e.g. bge-small-zh-v1.5 for "
        "intents in Chinese); unset: all-MiniLM-L6-v2 of agent-reach[semantic]",
    )
    semantic_quantize: bool = Field(
        True, description="int8 weights for the model's linear layers: half the CPU per intent"
    )

    @field_validator("dead_letter")
    @classmethod
    def _dead_letters_stay(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "dead letters cannot be turned off: a task that spent router.max_retry "
                "retries is kept as a dead letter, never dropped (bound them with "
                "router.max_retry and retention)"
            )
        return value

    @field_validator("backoff_cap")
    @classmethod
    def _cap_not_below_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("backoff_base")
        if base is not None and value < base:
            raise ValueError("backoff_cap must not be below backoff_base")
        return value


class ScoreSettings(_Section):
    """ReachScore weights and bounds; validated by ``reach.core.fleet.scoring.ScoreConfig``."""

    heartbeat_weight: float = Field(50.0, description="points of the heartbeat's freshness")
    rtt_weight: float = Field(30.0, description="points of the probes' round-trip time")
    loss_weight: float = Field(20.0, description="points of the probes' success rate")
    heartbeat_good_s: Seconds = Field(10.0, description="heartbeat age earning full points")
    heartbeat_bad_s: Seconds = Field(30.0, description="heartbeat age earning none")
    rtt_good_ms: Millis = Field(20.0, description="probe RTT earning full points")
    rtt_bad_ms: Millis = Field(500.0, description="probe RTT earning none")
    loss_good: float = Field(0.0, description="probe loss share earning full points")
    loss_bad: float = Field(0.30, description="probe loss share earning none")

    @model_validator(mode="after")
    def _valid_score(self) -> ScoreSettings:
        from reach.core.fleet.scoring import ScoreConfig, ScoreConfigError

        try:
            ScoreConfig(**self.model_dump())
        except ScoreConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


class BeatSettings(_Section):
    """The beat lock: one beat sends periodic tasks, the others stand by
    (``reach.hub.storage.leases``).

    A standby takes over at most ``lock_lease_s + lock_poll_s`` after the active beat died.
    """

    lock_lease_s: Seconds = Field(15.0, gt=0, le=3600, description="the active beat's lease")
    lock_renew_s: Seconds = Field(5.0, gt=0, description="the active beat renews this often")
    lock_poll_s: Seconds = Field(2.0, gt=0, le=3600, description="a standby asks this often")

    @field_validator("lock_renew_s")
    @classmethod
    def _renew_within_lease(cls, value: float, info: ValidationInfo) -> float:
        lease = info.data.get("lock_lease_s")
        if lease is not None and value >= lease:
            raise ValueError("lock_renew_s must be shorter than lock_lease_s")
        return value


class DagSettings(_Section):
    """The beat sweep of DAG runs whose canvas died (``reach.core.orchestration.dags.sweep``)."""

    sweep_interval: Seconds = Field(5.0, gt=0, le=3600, description="seconds between sweeps")
    sweep_margin: Seconds = Field(
        30.0,
        ge=0,
        le=86400,
        description="slack past a run's bounds (queueing, polls) before the sweep acts",
    )


class RetentionSettings(_Section):
    """The beat clean-up (``reach.hub.ops.retention``): finished records older than ``days`` go,
    in batches of ``batch_size`` rows, at most ``batches`` per kind of record each sweep."""

    days: Days = Field(30.0, gt=0, description="finished records older than this are deleted")
    sweep_interval_s: Seconds = Field(300.0, gt=0, le=86400, description="seconds between sweeps")
    offline_instance_hours: Hours = Field(
        24.0, gt=0, description="an instance offline this long is removed (no longer probed)"
    )
    batch_size: int = Field(500, ge=1, le=10_000, description="rows per delete statement")
    batches: int = Field(4, ge=1, le=1000, description="delete statements per kind per sweep")
    dead_letter_days: Days = Field(
        14.0, gt=0, description="an unresolved dead letter (and its task) is kept this long"
    )
    audit_days: Days = Field(90.0, gt=0, description="audit_log rows are kept this long")


class TlsSettings(_Section):
    """The hub's side of mutual TLS with L1 agents (``reach certs init`` writes these files
    under ``storage.home/certs``; empty values mean those defaults)."""

    ca_cert: str | None = Field(None, description="the hub CA that signs agent certificates")
    client_cert: str | None = Field(None, description="the certificate the hub presents")
    client_key: str | None = Field(None, description="its private key")


class SecuritySettings(_Section):
    """Who may reach whom (docs/security.md).

    ``require_auth`` unset means: required whenever the API listens beyond loopback
    (``reach.core.security.auth.auth_required``); the loopback-only demo may run open.
    """

    require_auth: bool | None = Field(None, description="API keys required; unset: by bind")
    issuer: str = Field("agent-reach", min_length=1, max_length=256, description="tokens' iss")
    token_ttl_s: Seconds = Field(
        300.0, ge=5, le=900, description="a reach token's lifetime (at most 15 min)"
    )
    sign_deliveries: bool = Field(True, description="a hub-signed token on every delivery")
    signing_rotation_grace_s: Seconds = Field(
        300.0, ge=0, le=86400, description="a rotated signing key is published this long first"
    )
    l3_max_payload_bytes: int = Field(
        65_536, ge=256, description="the payload cap of reaches to or from an L3 agent"
    )
    # failed authentications (bearer keys, the dashboard's sign-in) per client address:
    # this many within the window lock the address out (429, Retry-After) until the oldest
    # leaves it (reach.core.security.lockout)
    auth_failures_max: int = Field(
        30, ge=1, le=100_000, description="failed authentications that lock an address out"
    )
    auth_failures_window_s: Seconds = Field(
        60.0, gt=0, le=86400, description="the window auth_failures_max is counted over"
    )
    # secrets at rest (reach.hub.security.sealing): unset, <storage.home>/seal.key (made on
    # first use)
    seal_key: SecretStr | None = Field(
        None, description="base64url of 32 bytes; every hub process needs the same one"
    )
    allow_loopback_agents: bool = Field(
        False,
        description="loopback agent addresses allowed on a hub that is not a local demo "
        "(loopback bind with auth off allows them anyway)",
    )
    agent_networks: list[str] = Field(
        default_factory=list,
        description="CIDRs of private networks agents may live in (the hub probes and "
        "calls them); link-local is never called. Environment: a JSON list",
    )
    tls: TlsSettings = TlsSettings()

    @field_validator("agent_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        from reach.core.security.networks import parse_networks

        return [str(n) for n in parse_networks(value)]


class RegistrySettings(_Section):
    """Bounds on what one agent or one API key may hold in the registry (issue 37): a
    registration past one is refused (409 ``registry-limit``), so an agent key cannot
    crowd the fleet, its listings or the routing window."""

    max_instances_per_agent: int = Field(
        100, ge=1, le=100_000, description="live instances one agent may have registered"
    )
    max_instances_per_key: int = Field(
        1000, ge=1, le=1_000_000, description="live instances of the agents one API key owns"
    )
    max_agents_per_key: int = Field(
        100, ge=1, le=1_000_000, description="agents one API key may register (own)"
    )
    max_capabilities_per_agent: int = Field(
        64, ge=1, le=256, description="capabilities one agent may declare"
    )
    max_tags_per_agent: int = Field(32, ge=1, le=64, description="tags one agent may declare")
    max_declaration_bytes: int = Field(
        65_536, ge=1024, le=16 * 1024 * 1024,
        description="JSON size of one agent's capabilities, tags and metadata together",
    )  # fmt: skip


class ApprovalSettings(_Section):
    """The approval gate (``reach.hub.gates.approvals``): which tasks wait for a human, how long.

    A capability declaring ``require_approval`` or ``danger_level: high`` always waits;
    ``capabilities`` adds fnmatch patterns of methods or capabilities (``payments.*``).
    """

    timeout_s: Seconds = Field(
        3600.0, gt=0, le=30 * 86400, description="a request nobody decides expires after this"
    )
    capabilities: list[str] = Field(
        default_factory=list, description="fnmatch patterns that need approval by policy"
    )
    forbid_self_approval: bool = Field(True, description="the requester may not decide its own")
    approvers: dict[str, list[str]] = Field(
        default_factory=dict,
        description="designated approvers: a capability's fnmatch pattern -> the key names "
        "(holders) who alone may decide its approvals",
    )
    webhook_url: str | None = Field(None, description="each request is POSTed here, signed")
    webhook_allow_private: bool = Field(
        False, description="allow a loopback or private webhook address (refused: SSRF)"
    )
    webhook_max_retries: int = Field(
        12, ge=0, le=100, description="retries of a webhook the receiver did not take"
    )
    public_url: str | None = Field(
        None, description="the hub's URL as approvers reach it (links in the webhook)"
    )

    @field_validator("webhook_url", "public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
        return value

    sweep_interval_s: Seconds = Field(
        5.0, gt=0, le=3600, description="seconds between the beat's expiry sweeps"
    )


class SessionSettings(_Section):
    """Session liveness (``POST /v1/sessions/{id}/open|close``): reaches bound to a closed
    session are cancelled and new ones refused."""

    default_ttl_s: Seconds | None = Field(
        None, gt=0, le=30 * 86400, description="an opened session without a TTL lives this long"
    )
    max_ttl_s: Seconds = Field(
        7 * 86400.0, gt=0, le=365 * 86400, description="the longest TTL a session may ask for"
    )


class CallbackSettings(_Section):
    """Callbacks (``send(..., callback_url=)``): the hub POSTs a task's result, signed, to
    the caller's URL (``reach.hub.notify.callbacks``), at least once, then dead-letters it."""

    allow_private: bool = Field(
        False, description="allow loopback and private callback URLs (link-local: never)"
    )
    max_retries: int = Field(
        8, ge=0, le=100, description="failed POSTs retried this often before the dead letter"
    )
    backoff_base_s: Seconds = Field(1.0, gt=0, le=3600, description="first retry's delay")
    backoff_cap_s: Seconds = Field(300.0, gt=0, le=86400, description="longest retry delay")
    timeout_s: Seconds = Field(5.0, gt=0, le=120, description="a receiver's time to answer")
    sweep_interval_s: Seconds = Field(
        5.0, gt=0, le=3600, description="seconds between the beat's net for unsent callbacks"
    )


class ExchangeSettings(_Section):
    """The worker's exchanges with agents (``reach.hub.delivery.exchanger``): a worker
    slot claims, routes and signs an attempt, then hands the HTTP exchange to its
    process's event loop, which keeps many in flight while the slot takes the next."""

    max_in_flight: int = Field(
        2000,
        ge=1,
        le=100_000,
        description="agent exchanges one worker process keeps in flight; past it, its slots "
        "wait for a place",
    )
    lease_s: Seconds = Field(
        15.0,
        ge=1,
        le=3600,
        description="an attempt's lease while its exchange lasts, renewed every third of it: "
        "the exchanges of a worker that died are delivered again this long after",
    )
    drain_s: Seconds = Field(
        5.0,
        ge=0,
        le=3600,
        description="a worker stopping lets its exchanges end this long, then hands the rest "
        "back for delivery at once (inside a supervisor's 10 s stop grace)",
    )
    record_threads: int = Field(
        4, ge=1, le=64, description="threads per worker process that record agents' answers"
    )


class A2aSettings(_Section):
    """Agent2Agent interop (``reach.hub.interop.a2a``): A2A agents registered by their card and
    reached like any agent, and every hub agent served as an A2A agent under ``/a2a``."""

    card_refresh_s: Seconds = Field(
        10.0, gt=0, le=3600, description="a registered card is read again this often"
    )
    card_timeout_s: Seconds = Field(5.0, gt=0, le=120, description="a card fetch's time limit")
    poll_interval_s: Seconds = Field(
        1.0, gt=0, le=3600, description="GetTask cadence for an A2A task still working"
    )
    poll_failures: int = Field(
        3, ge=1, le=100, description="failed GetTask polls in a row: the attempt failed"
    )
    v03_compat: bool = Field(
        False, description="the hub's A2A endpoints also take v0.3 method names"
    )
    send_wait_s: Seconds = Field(
        30.0, ge=0, le=600, description="a blocking SendMessage to the hub waits this long"
    )


class McpAgentSettings(_Section):
    """MCP servers as agents (``reach.hub.interop.mcp.client``): registered with
    ``reach agents add-mcp URL``, their tools are capabilities, reached with ``tools/call``."""

    refresh_s: Seconds = Field(
        30.0,
        gt=0,
        le=3600,
        description="every MCP server's tool list is read again this often (its heartbeat)",
    )
    timeout_s: Seconds = Field(
        5.0, gt=0, le=120, description="initialize and tools/list (and a probe) must answer within"
    )


class AlertSettings(_Section):
    """The alert webhook (``reach.hub.ops.alert_webhook``): each new alert of a kind not
    muted is POSTed, signed by the hub, at least once, in the order it was recorded."""

    webhook_url: str | None = Field(
        None, description="each new alert is POSTed here, signed (unset: no webhook)"
    )
    webhook_allow_private: bool = Field(
        False, description="allow a loopback or private webhook address (refused: SSRF)"
    )
    webhook_max_retries: int = Field(
        12,
        ge=0,
        le=1000,
        description="retries of an alert the receiver did not take; then it is skipped "
        "(logged) so the next ones are not held up forever",
    )
    backoff_base_s: Seconds = Field(1.0, gt=0, le=3600, description="first retry's delay")
    backoff_cap_s: Seconds = Field(60.0, gt=0, le=86400, description="longest retry delay")
    push_interval_s: Seconds = Field(
        2.0, gt=0, le=3600, description="seconds between the beat's scans for new alerts"
    )
    batch: int = Field(100, ge=1, le=10_000, description="alerts one scan sends at most")

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
        return value


class BlobSettings(_Section):
    """Payload blobs (``PUT /v1/blobs``, a task's ``payload_ref``; ``reach.hub.blobs``): large
    payloads kept in a directory or an S3-compatible bucket, fetched by the agent with a
    short-lived signed link, deleted with their task."""

    store: Literal["dir", "s3"] = Field(
        "dir", description="where blobs are kept: dir (a directory) or s3 (a bucket)"
    )
    dir: str | None = Field(
        None, description="the blob directory (store dir); unset: <storage.home>/blobs"
    )
    max_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, le=1 << 40, description="the largest blob one PUT may store"
    )
    link_ttl_s: Seconds = Field(
        300.0, ge=5, le=7 * 86400, description="how long a blob link handed to an agent is valid"
    )
    orphan_ttl_s: Seconds = Field(
        86400.0,
        ge=60,
        le=365 * 86400,
        description="a blob no task references is deleted this long after its upload",
    )
    public_url: str | None = Field(
        None,
        description="the hub's URL as agents reach it, for links of the dir store; unset: "
        "a path the agent's SDK resolves against the hub it registered with",
    )
    s3_endpoint: str | None = Field(
        None, description="the S3 endpoint URL (unset: AWS's, from s3_region)"
    )
    s3_bucket: str | None = Field(None, description="the bucket (store s3; it must exist)")
    s3_prefix: str = Field("blobs/", max_length=256, description="object key prefix")
    s3_region: str | None = Field(None, description="the bucket's region")
    s3_access_key: SecretStr | None = Field(
        None, description="access key id; unset: boto3's own lookup (environment, profile, role)"
    )
    s3_secret_key: SecretStr | None = Field(None, description="secret access key")

    @field_validator("public_url", "s3_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _bucket(self) -> BlobSettings:
        if self.store == "s3" and not self.s3_bucket:
            raise ValueError("store s3 needs s3_bucket")
        return self


class LoggingSettings(_Section):
    """What the hub's processes log and how (``reach.hub.logs``): ``json`` writes one JSON
    object a line, with the process's role and the task, attempt, agent and trace at hand."""

    format: Literal["text", "json"] = Field(
        "text", description="text: the libraries' own lines; json: one JSON object a line"
    )
    access_log: bool = Field(
        False, description="the API logs a line per HTTP request (method, path, status)"
    )


class Settings(BaseSettings):
    """Every section of the hub's configuration.

    Start-up builds it with ``load_settings``. ``Settings()`` works too and reads
    ``os.environ`` and ``REACH_CONFIG`` the same way, the pydantic-settings habit, but
    reports a bad value as pydantic's ``ValidationError``.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=_NESTED, extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    storage: StorageSettings = StorageSettings()
    heartbeat: HeartbeatSettings = HeartbeatSettings()
    probe: ProbeSettings = ProbeSettings()
    router: RouterSettings = RouterSettings()
    score: ScoreSettings = ScoreSettings()
    retention: RetentionSettings = RetentionSettings()
    dags: DagSettings = DagSettings()
    beat: BeatSettings = BeatSettings()
    security: SecuritySettings = SecuritySettings()
    registry: RegistrySettings = RegistrySettings()
    approval: ApprovalSettings = ApprovalSettings()
    sessions: SessionSettings = SessionSettings()
    callbacks: CallbackSettings = CallbackSettings()
    exchanges: ExchangeSettings = ExchangeSettings()
    a2a: A2aSettings = A2aSettings()
    mcp_agents: McpAgentSettings = McpAgentSettings()
    alerts: AlertSettings = AlertSettings()
    blobs: BlobSettings = BlobSettings()
    logging: LoggingSettings = LoggingSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments > ``REACH_*`` environment > ``REACH_CONFIG`` file; no dotenv, no secrets."""
        return (init_settings, *_sources(settings_cls, os.environ, None))


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings from file and environment; raise ``ConfigError`` naming the key."""
    environment, config_file = _sources(
        Settings, os.environ if environ is None else environ, config_path
    )
    try:
        return Settings(_build_sources=((environment, config_file), {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        keys = tuple(str(p) for p in first["loc"])
        label = _source_of(keys, environment.origins) or ".".join(keys) or "<root>"
        raise ConfigError(f"invalid setting {label}: {first['msg']}", key=label) from None


class _Environment(EnvSettingsSource):
    """``REACH_*`` variables of a given mapping, read the way the documented names promise.

    Stricter than the stock source where start-up must fail loudly or stay out of others'
    way: the prefix is case-sensitive, only the shortcuts and ``__`` names are settings
    (``REACH_HUB_URL``, ``REACH_TEST_*`` belong to others), and an unknown section is
    refused instead of silently dropped.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        # The key path each variable sets, to name the variable when its value is refused.
        self.origins: dict[tuple[str, ...], str] = {}
        self._values: dict[tuple[str, ...], str] = {}
        for name, value in environ.items():
            keys = _keys_of(name)
            if keys is not None:
                self.origins[keys] = name
                self._values[keys] = value
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Already filtered on the case-sensitive prefix; named as the source then matches them.
        nested = self.env_nested_delimiter or _NESTED
        return {
            self._apply_case_sensitive(self.env_prefix + nested.join(keys)): value
            for keys, value in self._values.items()
        }

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        for keys, value in self._values.items():
            if keys[0] not in self.settings_cls.model_fields:
                _set_path(data, keys, value, self.origins[keys])  # extra="forbid" refuses it
        return data


class _ConfigFile(YamlConfigSettingsSource):
    """The YAML file; unlike the stock source, a missing or malformed file stops start-up."""

    # ``files`` is typed ``object``: the stock annotation changed between releases.
    def _read_files(self, files: object, deep_merge: bool = False) -> dict[str, Any]:
        if files is None:
            return {}
        if not isinstance(files, Path):
            raise TypeError("one config file path, not a list")
        return _read_yaml(files)


def _sources(
    settings_cls: type[BaseSettings],
    environ: Mapping[str, str],
    config_path: str | os.PathLike[str] | None,
) -> tuple[_Environment, _ConfigFile]:
    environment = _Environment(settings_cls, environ)
    path = config_path or environ.get("REACH_CONFIG")
    config_file = _ConfigFile(settings_cls, yaml_file=Path(path) if path else None)
    for keys, name in environment.origins.items():
        _refuse_below_a_value(config_file.yaml_data, keys, name)
    return environment, config_file


def _keys_of(name: str) -> tuple[str, ...] | None:
    """The key path an environment variable sets, or ``None`` when it is no setting."""
    if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
        return None
    if name in _SHORTCUTS:
        return _SHORTCUTS[name]
    if _NESTED in name:
        return tuple(part.lower() for part in name[len(ENV_PREFIX) :].split(_NESTED))
    return None  # unrelated REACH_* variables (e.g. used by tests) are left alone


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


def _refuse_below_a_value(data: Mapping[str, Any], keys: tuple[str, ...], source: str) -> None:
    """An environment key below a file value that is no section is a mistake, not an override."""
    node: Mapping[str, Any] = data
    for key in keys[:-1]:
        if key not in node:
            return
        child = node[key]
        if not isinstance(child, Mapping):
            raise ConfigError(f"{source} sets a key below a non-section value", key=source)
        node = child


def _set_path(data: dict[str, Any], keys: tuple[str, ...], value: str, source: str) -> None:
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source} sets a key below a non-section value", key=source)
        node = child
    node[keys[-1]] = value
