"""reach.hub.tracing in a fresh process of its own, as the hub's processes start it:
off (no OTEL_*), nothing of the tracing SDK loads and a traceparent passes through
untouched; on (the console exporter), spans continue the given context and
``current_trace_id`` names the trace of the span current in the block (what log lines use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.paths import REPO

T, S = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
PARENT = f"00-{T}-{S}-01"

OFF = f"""
import json, sys
from reach.hub import tracing
from reach.sdk import telemetry
assert not tracing.setup("reach-test")
stored = tracing.task_context("{PARENT}", {{"reach.method": "m"}})
span, sent = tracing.begin_attempt(stored, {{"reach.method": "m"}})
with telemetry.span("h", sent, {{}}) as handed, tracing.within(span):
    current = tracing.current_trace_id()
tracing.end_attempt(span, "success", failed=False)
tracer = ("opentelemetry.sdk.trace", "opentelemetry.exporter")
loaded = sorted(m for m in sys.modules if m.startswith(tracer))
print(json.dumps([stored, sent, handed, current, loaded]))
"""

ON = f"""
import json
from reach.hub import tracing
from reach.sdk import telemetry
assert tracing.setup("reach-test")
assert tracing.current_trace_id() is None  # no span current
stored = tracing.task_context("{PARENT}", {{"reach.method": "m", "reach.task_id": "t1"}})
span, sent = tracing.begin_attempt(stored, {{"reach.method": "m", "reach.attempt": 1}})
with tracing.within(span):
    current = tracing.current_trace_id()
tracing.end_attempt(span, "transient", failed=True)
telemetry.flush()
print("RESULT " + json.dumps([stored, sent, current]))
"""


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def test_off_loads_nothing_and_passes_the_context_through() -> None:
    stored, sent, handed, current, loaded = json.loads(_run(OFF).splitlines()[-1])
    assert stored == sent == handed == PARENT
    assert current is None
    assert loaded == []


def test_on_spans_continue_the_context_and_name_the_current_trace() -> None:
    out = _run(ON, OTEL_TRACES_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="50")
    stored, sent, current = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert stored.split("-")[1] == sent.split("-")[1] == current == T
    assert len({PARENT, stored, sent}) == 3  # a task span, then an attempt span under it
    spans = json.loads("[" + out.split("RESULT ", 1)[0].replace("}\n{", "},\n{") + "]")
    by_name = {s["name"]: s for s in spans}
    task, attempt = by_name["reach.task m"], by_name["reach.attempt m"]
    assert task["parent_id"] == "0x" + S
    assert attempt["parent_id"] == task["context"]["span_id"]
    assert attempt["attributes"]["reach.outcome"] == "transient"
    assert attempt["status"]["status_code"] == "ERROR"
    assert task["resource"]["attributes"]["service.name"] == "reach-test"
