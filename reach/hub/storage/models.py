"""Tables of the hub. Timestamps are float epoch seconds from the hub's clock.

Floats keep SQLite and PostgreSQL identical (no naive/aware datetime drift) and make
controlled-clock tests exact. The schema itself is owned by Alembic migrations;
these models must match them (a migration test checks it).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from reach.core.ledger.statuses import LIVE

LIVE_STATUSES = tuple(sorted(s.value for s in LIVE))
LIVE_TASK = "status IN (" + ", ".join(f"'{s}'" for s in LIVE_STATUSES) + ")"
"""A task in delivery's hands, as SQL: the predicate of ``ix_tasks_agent_live``. The
queue count spells its statuses as the same literals (`reach.hub.flow.admission`): a query
whose statuses are bound parameters cannot be proven to match it under a generic plan."""

OPEN_CLAIM = "claimed_at IS NOT NULL"
"""An outbox row a relay claimed and has not settled: the predicate of ``ix_outbox_claimed``."""


class Base(DeclarativeBase):
    pass


def in_schema_of(dialect: str) -> Any:
    """Alembic's ``include_object`` for ``dialect``: leaves out what the models create on
    other databases only (``info["dialects"]``; autogenerate does not read ``ddl_if``)."""

    def include(obj: Any, _name: Any, _type: str, _reflected: bool, _compare_to: Any) -> bool:
        dialects = getattr(obj, "info", {}).get("dialects")
        return dialects is None or dialect in dialects

    return include


class AgentRow(Base):
    __tablename__ = "agents"

    agent_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    capabilities: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    trust_level: Mapped[str] = mapped_column(String(8), default="L2")
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    # its queue bound: the admin's override wins over what it declared; both None: the
    # router's ``max_queue``
    max_queue: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_queue_override: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the API key (its key_id) that first registered the agent; None: an open hub's, or
    # registered before owners were kept. What one key holds is bounded by it.
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)


class AgentTagRow(Base):
    """One tag an agent declared: the index that finds agents by tag without a fleet scan
    (``agents.tags`` keeps the declaration; this is written beside it at registration)."""

    __tablename__ = "agent_tags"
    __table_args__ = (Index("ix_agent_tags_tag", "tag", "agent_id"),)

    agent_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("agents.agent_id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)


class AgentCapabilityRow(Base):
    """One capability type an agent declared, indexed like ``agent_tags``."""

    __tablename__ = "agent_capabilities"
    __table_args__ = (Index("ix_agent_capabilities_capability", "capability", "agent_id"),)

    agent_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("agents.agent_id", ondelete="CASCADE"), primary_key=True
    )
    capability: Mapped[str] = mapped_column(String(128), primary_key=True)
    # semantic matching (reach.hub.fleet.matching): the vectors of the capability's texts, one
    # float32 row per text, and the digest of the model and texts they were made from
    embedding_digest: Mapped[str | None] = mapped_column(String(64))
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)


# Deregistered instances stay for the audit trail; the probe claim must not walk them.
PROBED = "status <> 'deregistered'"


class InstanceRow(Base):
    __tablename__ = "instances"
    __table_args__ = (
        Index("ix_instances_agent_status", "agent_id", "status"),
        # the probe claim's due scan: only instances that are probed at all (partial)
        Index(
            "ix_instances_probe_due",
            "next_probe_at",
            sqlite_where=text(PROBED),
            postgresql_where=text(PROBED),
        ),
        Index("ix_instances_probe_lease", "probe_lease_until"),
        # registration's one-live-instance-per-address check
        Index("ix_instances_endpoint", "endpoint"),
        Index("ix_instances_public_endpoint", "public_endpoint"),
        Index("ix_instances_status_changed", "status", "status_changed_at"),  # retention
    )

    instance_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("agents.agent_id", ondelete="CASCADE")
    )
    endpoint: Mapped[str] = mapped_column(String(512))
    public_endpoint: Mapped[str | None] = mapped_column(String(512), nullable=True)
    version: Mapped[str] = mapped_column(String(64), default="")
    max_concurrency: Mapped[int] = mapped_column(Integer)
    heartbeat_interval: Mapped[float] = mapped_column(Double)
    allow_loopback: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    registered_at: Mapped[float] = mapped_column(Double)
    last_heartbeat: Mapped[float] = mapped_column(Double)
    status_changed_at: Mapped[float] = mapped_column(Double)
    heartbeat_count: Mapped[int] = mapped_column(Integer, default=0)
    current_load: Mapped[float] = mapped_column(Double, default=0.0)
    in_flight: Mapped[int] = mapped_column(Integer, default=0)
    last_task_duration_ms: Mapped[float | None] = mapped_column(Double, nullable=True)
    consecutive_failure_count: Mapped[int] = mapped_column(Integer, default=0)
    agent_reported_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # reachability (two signals): probe window, smoothed values, score and verdict
    probe_window: Mapped[list[dict[str, Any]]] = mapped_column(
        JSON, default=list, server_default="[]"
    )
    probe_status: Mapped[str] = mapped_column(
        String(16), default="unknown", server_default="unknown"
    )
    rtt_ms: Mapped[float | None] = mapped_column(Double, nullable=True)
    loss_rate: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    last_probe_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    last_probe_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    next_probe_at: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    probe_lease_until: Mapped[float | None] = mapped_column(Double, nullable=True)
    reach_score: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    routable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    in_flight_rise_streak: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    alerts: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    status_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # circuit breaker (reach.core.flow.breakers): out of the routing pool while
    # now < breaker_open_until
    breaker_open_until: Mapped[float | None] = mapped_column(Double, nullable=True)
    breaker_opened_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # when a successful trial closed it: the instance's share ramps up from there
    breaker_closed_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # how the worker delivers to it: ``reach`` (the SDK's POST), ``a2a`` (JSON-RPC) or
    # ``mcp`` (tools/call); the peer as the hub read it (an A2A card; an MCP server's name
    # and tools: ``reach.hub.interop.mcp.servers``), and the secret presented under an A2A
    # card's scheme
    protocol: Mapped[str] = mapped_column(String(16), default="reach", server_default="reach")
    a2a: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    a2a_credential: Mapped[str | None] = mapped_column(Text, nullable=True)


class InstanceEventRow(Base):
    """What happened to an instance: status transitions, alerts and breaker transitions."""

    __tablename__ = "instance_events"
    __table_args__ = (
        Index("ix_instance_events_instance_at", "instance_id", "at"),
        Index("ix_instance_events_at", "at"),  # retention
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(String(64))
    agent_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    at: Mapped[float] = mapped_column(Double)


class TaskRow(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        Index("ix_tasks_status_next_attempt", "status", "next_attempt_at"),
        Index("ix_tasks_agent_status", "agent_id", "status"),  # an agent's tasks by status
        # an agent's queue depth, on every submit: entries only for live versions (0019).
        # PostgreSQL only: SQLite removes a changed row's old index entries at once, so
        # its full index has no dead entries to skip
        Index(
            "ix_tasks_agent_live",
            "agent_id",
            postgresql_where=text(LIVE_TASK),
            info={"dialects": {"postgresql"}},  # for autogenerate (`in_schema_of`)
        ).ddl_if(dialect="postgresql"),
        Index("ix_tasks_session_status", "session_id", "status"),  # a closed session's reaches
        # is online work waiting? (``reach.hub.flow.priority``, asked by background deliveries)
        Index("ix_tasks_priority_status", "priority", "status", "next_attempt_at"),
        Index("ix_tasks_created", "created_at", "id"),  # the operator's list, newest first
        Index("ix_tasks_remote_status", "status", "remote_task_id"),  # A2A tasks followed
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(128), unique=True)
    # agent_id and status lead composite indexes above (no index of their own: 0017)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    target: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    method: Mapped[str] = mapped_column(String(128))
    payload: Mapped[Any] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(24))
    attempt_seq: Mapped[int] = mapped_column(Integer, default=0)
    instance_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(256), nullable=True)
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    trace: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    timeout_ms: Mapped[int] = mapped_column(Integer, default=30_000)
    deadline: Mapped[float | None] = mapped_column(Double, nullable=True)
    result: Mapped[Any] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    # delivery bookkeeping: transient failures, lost workers, backpressure deferrals
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    redeliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    deferrals: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    lease_until: Mapped[float | None] = mapped_column(Double, nullable=True)
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    last_published_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    accepted_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True, index=True)
    callback_url: Mapped[str | None] = mapped_column(String(512), nullable=True)
    max_retry: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the authenticated identity that submitted it (``reach.core.security.auth.Principal.identity``)
    caller: Mapped[str | None] = mapped_column(String(160), nullable=True)
    # online | background: which delivery queue its attempts go to
    priority: Mapped[str] = mapped_column(String(16), default="online", server_default="online")
    # the A2A task the current attempt started (followed with GetTask while it works)
    remote_task_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # the blob that carries the task's large payload (``blobs``, ``reach.hub.blobs``)
    payload_ref: Mapped[str | None] = mapped_column(String(40), nullable=True)


class TaskEventRow(Base):
    __tablename__ = "task_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(128), index=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    instance_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    attempt_seq: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    at: Mapped[float] = mapped_column(Double)
    # who caused it: a caller, agent or admin identity, or ``hub`` for the hub's own steps
    actor: Mapped[str | None] = mapped_column(String(160), nullable=True)


class OutboxRow(Base):
    """One publication of one delivery attempt; the unique key makes relaying idempotent."""

    __tablename__ = "outbox"
    __table_args__ = (
        UniqueConstraint("agent_id", "task_id", "attempt_seq", name="uq_outbox_attempt"),
        Index("ix_outbox_unpublished", "published_at", "created_at"),
        # the relay's claims not yet settled (0020): entries only while a claim is open,
        # so the lapsed-claim net reads a handful of rows however large the table grows
        Index(
            "ix_outbox_claimed",
            "claimed_at",
            postgresql_where=text(OPEN_CLAIM),
            sqlite_where=text(OPEN_CLAIM),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(128), index=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    attempt_seq: Mapped[int] = mapped_column(Integer)
    message: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)
    available_at: Mapped[float] = mapped_column(Double)
    published_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # when a relay claimed the row, until it settles the claim (confirmed or handed back)
    claimed_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class DeadLetterRow(Base):
    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(128), index=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    method: Mapped[str] = mapped_column(String(128))
    payload: Mapped[Any] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer)
    last_error: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Double)
    replayed_at: Mapped[float | None] = mapped_column(Double, nullable=True, index=True)
    target: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")


class DagRunRow(Base):
    __tablename__ = "dag_runs"
    __table_args__ = (Index("ix_dag_runs_created", "created_at", "id"),)  # newest first

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    input: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True, index=True)
    caller: Mapped[str | None] = mapped_column(String(160), nullable=True)
    # the run's span context: its nodes' tasks continue it (reach.hub.tracing)
    traceparent: Mapped[str | None] = mapped_column(String(64), nullable=True)


class DagNodeRunRow(Base):
    __tablename__ = "dag_node_runs"
    __table_args__ = (UniqueConstraint("run_id", "node_id", name="uq_dag_node_run"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(128))
    node_id: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    task_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    data: Mapped[Any] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class BroadcastRow(Base):
    """One request fanned out to every matching instance (one task per target)."""

    __tablename__ = "broadcasts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    broadcast_id: Mapped[str] = mapped_column(String(128), unique=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    targets: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    min_results: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Double)
    deadline: Mapped[float] = mapped_column(Double, index=True)
    caller: Mapped[str | None] = mapped_column(String(160), nullable=True)


class LeaseRow(Base):
    """A named single-holder lease (``reach.core.ops.lease``): e.g. the one active beat."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(255), nullable=True)
    expires_at: Mapped[float] = mapped_column(Double)
    acquired_at: Mapped[float] = mapped_column(Double)


class ApiKeyRow(Base):
    """A hub credential: its id and the SHA-256 of its secret (the secret is never stored)."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), default="", server_default="")
    scope: Mapped[str] = mapped_column(String(16))
    agent_pattern: Mapped[str | None] = mapped_column(String(128), nullable=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    # an agent key's allow-lists (fnmatch patterns) of what its agents may declare; None:
    # anything. Set and widened by an admin only (``reach keys allow``).
    allowed_capabilities: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    allowed_tags: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)


class UiSignOutRow(Base):
    """A dashboard session signed out before its cookie expires (issue 37): the cookie is
    refused from then on. Kept until the session would have expired anyway."""

    __tablename__ = "ui_sign_outs"
    __table_args__ = (Index("ix_ui_sign_outs_expires", "expires_at"),)  # retention

    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    signed_out_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)


class SigningKeyRow(Base):
    """A key that signs reach tokens: it signs from ``not_before`` until a newer key takes
    over, and stays published in the JWKS until ``retire_after``."""

    __tablename__ = "signing_keys"

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    algorithm: Mapped[str] = mapped_column(String(16))
    private_pem: Mapped[str] = mapped_column(Text)
    public_jwk: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)
    not_before: Mapped[float] = mapped_column(Double)
    retire_after: Mapped[float | None] = mapped_column(Double, nullable=True)


class AgentAllowRuleRow(Base):
    """One entry of an L3 agent's allow-list: ``call`` (a capability or method pattern it
    may reach) or ``callable_by`` (an agent ID or identity that may reach it)."""

    __tablename__ = "agent_allow_rules"
    __table_args__ = (UniqueConstraint("agent_id", "kind", "value", name="uq_agent_allow_rule"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[float] = mapped_column(Double)
    created_by: Mapped[str] = mapped_column(String(160), default="", server_default="")


class AuditRow(Base):
    """A security-relevant act: an admin change, an L3 reach, a refused attempt."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Double, index=True)
    actor: Mapped[str] = mapped_column(String(160))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(160), default="", server_default="")
    outcome: Mapped[str] = mapped_column(String(16))
    task_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ApprovalRow(Base):
    """The human decision a parked task waits on, bound to the hash of its payload."""

    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_status_expires", "status", "expires_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    approval_id: Mapped[str] = mapped_column(String(64), unique=True)
    task_id: Mapped[str] = mapped_column(String(128), unique=True)
    capability: Mapped[str] = mapped_column(String(128))
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    method: Mapped[str] = mapped_column(String(128))
    caller: Mapped[str | None] = mapped_column(String(160), nullable=True)
    payload_hash: Mapped[str] = mapped_column(String(64))
    requested_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    status: Mapped[str] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    decided_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    decided_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class SessionRow(Base):
    """A user session reaches are bound to (``session_id``): closing it cancels them."""

    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))  # open | closed
    owner: Mapped[str | None] = mapped_column(String(160), nullable=True)
    opened_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    closed_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    closed_by: Mapped[str | None] = mapped_column(String(160), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class FlowCountRow(Base):
    """One second's count of one hub-wide window (``reach.hub.flow.shared_counts``)."""

    __tablename__ = "flow_counts"
    __table_args__ = (Index("ix_flow_counts_bucket", "bucket"),)

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)


class AgentLinkRow(Base):
    """An ordered agent pair suspected of a dependency loop (both ways busy), demoted to
    background priority until ``demoted_until``."""

    __tablename__ = "agent_links"

    src: Mapped[str] = mapped_column(String(128), primary_key=True)
    dst: Mapped[str] = mapped_column(String(128), primary_key=True)
    suspected_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    demoted_until: Mapped[float | None] = mapped_column(Double, nullable=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class CallbackRow(Base):
    """A POST of a task's result (or one progress event) to the caller's callback URL:
    ``waiting`` until the task ends, then ``due`` -> ``delivered`` or ``dead``."""

    __tablename__ = "callbacks"
    __table_args__ = (Index("ix_callbacks_status_next", "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="result", server_default="result")
    event_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    url: Mapped[str] = mapped_column(Text)
    context: Mapped[Any] = mapped_column(JSON, nullable=True)
    body: Mapped[Any] = mapped_column(JSON, nullable=True)  # a progress row's report
    progress: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    status: Mapped[str] = mapped_column(String(16))  # waiting | due | delivered | dead
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    delivered_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class AlertMuteRow(Base):
    """An alert kind an admin muted: not pushed by the alert webhook, hidden from the
    alerts list unless asked for (``reach.hub.ops.alerts``)."""

    __tablename__ = "alert_mutes"

    kind: Mapped[str] = mapped_column(String(64), primary_key=True)
    muted_by: Mapped[str] = mapped_column(String(160))
    muted_at: Mapped[float] = mapped_column(Double)


class AlertPushRow(Base):
    """The alert webhook's marker (one row, ``id`` 1): the highest id of each source table
    already pushed (or skipped), and the retry state of the alert next in line
    (``reach.hub.ops.alert_webhook``)."""

    __tablename__ = "alert_push"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    event_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    audit_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    dead_letter_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    lease_until: Mapped[float | None] = mapped_column(Double, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[float] = mapped_column(Double)


class BlobRow(Base):
    """A payload blob (``PUT /v1/blobs``): whose it is, what it holds, and the task that
    took it as ``payload_ref`` (``reach.hub.blobs.records``). The bytes live in the blob
    store; ``doomed_at`` marks a blob on its way out (its bytes are deleted, then the row)."""

    __tablename__ = "blobs"
    __table_args__ = (
        Index("ix_blobs_task", "task_id"),  # a task's blob; blobs whose task is gone
        Index("ix_blobs_created", "created_at"),  # orphans, oldest first
    )

    blob_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(160))  # the uploader's identity
    key_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # and its key
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    content_type: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Double)
    task_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    doomed_at: Mapped[float | None] = mapped_column(Double, nullable=True)
