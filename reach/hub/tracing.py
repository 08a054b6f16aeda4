"""The hub's spans: one trace per reach, continued through the store.

A reach's trace context travels as a W3C ``traceparent``: from the caller's request to
the task's span (`task_context`, written at submit), stored in the task's ``trace``
(``trace["traceparent"]``) so that whichever process delivers an attempt, after a relay,
a net or a restart, continues it; each attempt is a span of its own under the task's
(`begin_attempt` / `end_attempt`: retries are siblings), whose context the agent is sent
(header and the delivery's ``trace``). A DAG run's span is the parent of its nodes'.

Off (``reach.core.telemetry.switch``: no ``OTEL_*`` variable asks for it), nothing is
imported and no span is made; a traceparent a caller sent is still stored and handed on.
"""

from __future__ import annotations

from typing import Any

from reach.core.telemetry.traceparent import parse, trace_id_of
from reach.sdk import telemetry

KEY = "traceparent"
"""Where a task's ``trace`` keeps its span's context."""

TRACED_REQUESTS = frozenset({("POST", "/v1/tasks"), ("POST", "/api/v1/dag-runs")})
"""The requests FastAPI's own server span covers (it continues the caller's
``traceparent``): those that start a reach. Heartbeats, reads and the dashboard make none."""


def _untraced(scope: Any) -> bool:
    return (scope.get("method"), scope.get("path")) not in TRACED_REQUESTS


FASTAPI_TELEMETRY: Any = {
    "operation_spans": False,
    "metrics": False,  # the hub's metrics are Prometheus's (/metrics)
    "logs": False,
    "exclude": _untraced,
}
"""FastAPI's built-in OpenTelemetry (active only once a tracer provider is installed):
one server span per traced request, nothing else."""


def setup(role: str) -> bool:
    """Start tracing in a hub process (``reach-api``, ``reach-worker``, ``reach-beat``)
    when the environment asks for it; False when off."""
    return telemetry.configure(role)


def enabled() -> bool:
    return telemetry.enabled()


def flush() -> None:
    """Export the spans this process still holds (a prefork child about to exit)."""
    telemetry.flush()


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the span current in this thread or coroutine, for
    log lines; None when tracing is off or no span is current."""
    return telemetry.current_trace_id()


def checked(value: str | None) -> str | None:
    """A caller's ``traceparent`` header if it is one (a malformed one starts a new
    trace, as the W3C spec says)."""
    return value if parse(value) is not None else None


def task_context(
    parent: str | None, attributes: dict[str, Any], name: str | None = None
) -> str | None:
    """The traceparent a new task (or DAG run) stores: its own span's, a child of the
    caller's ``parent`` (or a root); off, the caller's as it came (None: none). The span
    marks the acceptance and ends at once: the attempts, later and maybe elsewhere, are
    its children."""
    if not telemetry.enabled():
        return parent
    # in the API, FastAPI's server span (itself continuing the caller's header) is current
    parent = telemetry.current_traceparent() or parent
    name = name or f"reach.task {attributes.get('reach.method')}"
    span = telemetry.start(name, parent, attributes, "server")
    context = telemetry.header_of(span)
    telemetry.finish(span, "accepted")
    return context


def of_trace(trace: dict[str, Any] | None) -> str | None:
    """The traceparent stored in a task's ``trace``."""
    value = (trace or {}).get(KEY)
    return value if isinstance(value, str) else None


def trace_id(trace: dict[str, Any] | None) -> str | None:
    """The trace id of a task's stored context (what its events and its page show)."""
    return trace_id_of(of_trace(trace))


def begin_attempt(parent: str | None, attributes: dict[str, Any]) -> tuple[Any, str | None]:
    """An attempt's span under its task's (``parent``): (the span to end, the traceparent
    the agent is sent). Off: (None, ``parent``)."""
    if not telemetry.enabled():
        return None, parent
    name = f"reach.attempt {attributes.get('reach.method')}"
    span = telemetry.start(name, parent, attributes, "client")
    return span, telemetry.header_of(span)


def within(span: Any) -> Any:
    """A context manager making an attempt's span current (its log lines name its trace:
    `current_trace_id`); does nothing for None."""
    return telemetry.within(span)


def end_attempt(span: Any, outcome: str, failed: bool, **attributes: Any) -> None:
    """End an attempt's span (None: tracing off) with how its exchange ended."""
    telemetry.finish(span, outcome, outcome if failed else None, **attributes)
