"""JSON log lines (``reach.hub.logs``): the fields, the task at hand through threads and
asyncio tasks, the trace id of a real OpenTelemetry span, and ``configure`` turning a
process's every logger (libraries' included) into one JSON line per record."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from typing import Any

import pytest

from reach.errors import ConfigError
from reach.hub import logs
from reach.hub.settings import load_settings
from tests.support.paths import REPO


def line_of(record: logging.LogRecord, role: str = "worker") -> dict[str, Any]:
    text = logs.JsonFormatter(role).format(record)
    assert "\n" not in text
    return dict(json.loads(text))


def record(message: str = "hello %s", *args: object, **extra: Any) -> logging.LogRecord:
    return logging.LogRecord("reach.test", logging.WARNING, __file__, 1, message, args or None,
                             extra.get("exc_info"))  # fmt: skip


def test_a_line_carries_the_promised_fields() -> None:
    line = line_of(record("hello %s", "there"), role="api")
    assert line["message"] == "hello there"
    assert line["level"] == "WARNING" and line["logger"] == "reach.test"
    assert line["role"] == "api" and isinstance(line["pid"], int)
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    assert not {"task_id", "attempt", "agent_id"} & set(line)


def test_lines_inside_a_task_context_name_the_task_and_outer_values_come_back() -> None:
    with logs.task_context("t-1", 1):
        assert line_of(record())["task_id"] == "t-1"
        with logs.task_context(attempt=2, agent_id="a-1"):
            inner = line_of(record())
            assert (inner["task_id"], inner["attempt"], inner["agent_id"]) == ("t-1", 2, "a-1")
        after = line_of(record())
        assert after["attempt"] == 1 and "agent_id" not in after
    assert "task_id" not in line_of(record())


def test_each_asyncio_task_and_thread_logs_its_own_task() -> None:
    seen: dict[str, str] = {}

    async def exchange(task_id: str, other_started: asyncio.Event, mine: asyncio.Event) -> None:
        logs.bind_task(task_id, 1, "agent")
        mine.set()
        await other_started.wait()  # interleaved with the other exchange
        seen[task_id] = line_of(record())["task_id"]

    async def both() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(exchange("t-a", b, a), exchange("t-b", a, b))

    asyncio.run(both())
    assert seen == {"t-a": "t-a", "t-b": "t-b"}

    def thread() -> None:
        seen["thread"] = line_of(record()).get("task_id", "none")

    with logs.task_context("t-main"):
        worker = threading.Thread(target=thread)
        worker.start()
        worker.join()
    assert seen["thread"] == "none"  # a thread starts with a context of its own


def test_a_traceback_stays_on_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        line = line_of(record("failed", exc_info=sys.exc_info()))
    assert "ValueError: bad" in line["exception"]


def test_the_trace_id_of_the_current_span() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    assert "trace_id" not in line_of(record())  # no span: no trace id
    with tracer.start_as_current_span("reach") as span:
        line = line_of(record())
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_the_log_format_setting_and_its_shortcut() -> None:
    assert load_settings(environ={}).logging.format == "text"
    assert load_settings(environ={"REACH_LOG_FORMAT": "json"}).logging.format == "json"
    assert load_settings(environ={"REACH_LOGGING__FORMAT": "json"}).logging.format == "json"
    with pytest.raises(ConfigError, match="REACH_LOG_FORMAT"):
        load_settings(environ={"REACH_LOG_FORMAT": "yaml"})


CONFIGURED = """
import logging, sys, warnings
from reach.hub import logs
library = logging.getLogger("library")
library.addHandler(logging.StreamHandler(sys.stderr))  # a library's own text handler
library.propagate = False
library.setLevel(logging.INFO)
silenced = logging.getLogger("silenced")
silenced.addHandler(logging.NullHandler())
silenced.propagate = False
print(logs.configure(sys.argv[1], "beat"), flush=True)
library.info("from a library")
silenced.warning("never shown")
logging.getLogger("reach.x").info("from reach")
warnings.warn("careful")
"""


def run_configured(log_format: str) -> tuple[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", CONFIGURED, log_format],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.splitlines()


def test_configure_json_turns_every_logger_of_the_process_into_json_lines() -> None:
    said, lines = run_configured("json")
    assert said == "True"
    records = [json.loads(line) for line in lines]  # every line parses
    assert [(r["logger"], r["message"]) for r in records[:2]] == [
        ("library", "from a library"),  # once, as JSON: its own handler is gone
        ("reach.x", "from reach"),
    ]
    assert records[2]["logger"] == "py.warnings" and "careful" in records[2]["message"]
    assert len(records) == 3  # the silenced logger stays silent
    assert {r["role"] for r in records} == {"beat"}


def test_configure_text_changes_nothing() -> None:
    said, lines = run_configured("text")
    assert said == "False"
    assert "from a library" in lines  # the library's own handler, as before
    assert not any(line.startswith("{") for line in lines)


SUPERVISOR = """
from reach.cli.supervisor import Screen
from reach.hub import logs
logs.configure("json", "up")
Screen().say("[bold]Agent-Reach is up[/bold]")
Screen().say("")
Screen().say("[red]worker exited with code 1; stopping the hub[/red]", to_stderr=True)
"""


def test_reach_up_says_its_lines_as_json_log_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["level"], r["message"], r["role"]) for r in records] == [
        ("INFO", "Agent-Reach is up", "up"),  # the markup dropped, the blank line too
        ("WARNING", "worker exited with code 1; stopping the hub", "up"),
    ]
