"""Log lines a machine can read: one JSON object a line (``logging.format: json``).

The standard library's ``logging`` with a formatter of ours, not structlog: Celery,
kombu, uvicorn and tornado (Flower) all log through ``logging`` already, so one handler
on the root logger turns every line of a process into JSON, theirs included, with no
dependency and no bridge. What a line says about the work at hand comes from context
variables the hub sets where it handles a task (`task_context`: intake, the delivery
pipeline and its exchanges, agents' reports): they follow threads' and asyncio tasks'
own contexts, so thousands of exchanges in flight on one loop each log their own task.

A line carries ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
``role`` (api, worker, beat, flower, up) and ``pid``; then ``task_id``, ``attempt``,
``agent_id`` and ``trace_id`` when they apply, and ``exception`` for a traceback. The trace
id is read only when OpenTelemetry is already imported (tracing on): off, it costs nothing.

Secrets stay out the way they always have: the hub never puts a key, a token or a
signature in a message (tests/acceptance/test_json_logs.py greps every log of a run).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

LogFormat = Literal["text", "json"]
ROLES = ("api", "worker", "beat", "flower", "up")

_role: str | None = None  # set by `configure`: JSON lines are on in this process
_task_id: ContextVar[str | None] = ContextVar("reach_task_id", default=None)
_attempt: ContextVar[int | None] = ContextVar("reach_attempt", default=None)
_agent_id: ContextVar[str | None] = ContextVar("reach_agent_id", default=None)


@contextmanager
def task_context(
    task_id: str | None = None, attempt: int | None = None, agent_id: str | None = None
) -> Iterator[None]:
    """Lines logged inside name this task (attempt, agent); the outer values come back
    after. A field left ``None`` keeps what an outer context set."""
    before = (_task_id.get(), _attempt.get(), _agent_id.get())
    bind_task(task_id, attempt, agent_id)
    try:
        yield
    finally:
        _task_id.set(before[0])
        _attempt.set(before[1])
        _agent_id.set(before[2])


def bind_task(
    task_id: str | None = None, attempt: int | None = None, agent_id: str | None = None
) -> None:
    """Set the task fields for the rest of this context (an asyncio task of its own, or a
    Celery task's run, whose end `clear_task` marks)."""
    if task_id is not None:
        _task_id.set(task_id)
    if attempt is not None:
        _attempt.set(attempt)
    if agent_id is not None:
        _agent_id.set(agent_id)


def clear_task() -> None:
    """No task at hand any more (a Celery task ended on this thread)."""
    _task_id.set(None)
    _attempt.set(None)
    _agent_id.set(None)


def configured_role() -> str | None:
    """The role `configure` set for this process's JSON lines; None: not configured."""
    return _role


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits), only when OpenTelemetry is loaded."""
    if "opentelemetry" not in sys.modules:  # tracing off: never imported here
        return None
    otel: Any = importlib.import_module("opentelemetry.trace")
    span = otel.get_current_span().get_span_context()
    return format(span.trace_id, "032x") if span.is_valid else None


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON, with the process's role and the task at hand."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "role": self.role,
            "pid": record.process,
        }
        for key, var in (("task_id", _task_id), ("attempt", _attempt), ("agent_id", _agent_id)):
            value = var.get()
            if value is not None:
                line[key] = value
        trace = trace_id()
        if trace is not None:
            line["trace_id"] = trace
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # one line whatever the message holds: json.dumps escapes newlines
        return json.dumps(line, ensure_ascii=False, default=str)


def _timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def configure(log_format: str, role: str, level: int | str = logging.INFO) -> bool:
    """Send every logger's lines through one JSON handler on stderr (``json``); whether it
    did. ``text`` leaves logging as the libraries set it up (nothing changes)."""
    global _role
    if log_format != "json":
        return False
    _role = role
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a warning is a line of ``py.warnings``, not raw stderr
    # the libraries' own handlers would write their lines a second time, as text (a
    # logger silenced on purpose, with only a NullHandler, stays silent)
    for name in list(logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        if logger.handlers and all(isinstance(h, logging.NullHandler) for h in logger.handlers):
            continue
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
    return True


__all__ = [
    "ROLES",
    "JsonFormatter",
    "LogFormat",
    "bind_task",
    "clear_task",
    "configure",
    "configured_role",
    "task_context",
    "trace_id",
]
