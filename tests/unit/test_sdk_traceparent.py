"""What a submit built by the SDK carries of the W3C trace context (no OpenTelemetry
configured in this process): inside a handler, the traceparent its delivery brought (or its
span's); at the edge, none."""

from __future__ import annotations

from typing import Any

from reach.sdk import trace
from reach.sdk.caller import send_call

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _call() -> Any:
    return send_call(
        method="m", payload={}, payload_ref=None, agent_id="b", tags=(), capability=None,
        intent=None, rules=None, task_id=None, timeout_ms=1000, session_id=None, priority="online",
        callback_url=None, callback_context=None, callback_progress=False,
    )  # fmt: skip


def test_a_handler_hands_its_traceparent_on() -> None:
    with trace.handling("t1", {"root_id": "t1"}, "a", traceparent=TP):
        assert dict(_call().headers) == {"traceparent": TP}
        assert "traceparent" not in _call().data["trace"]  # the body's trace stays the wire's


def test_no_trace_no_header() -> None:
    assert _call().headers == ()
    with trace.handling("t1", {"root_id": "t1"}, "a"):
        assert _call().headers == ()
