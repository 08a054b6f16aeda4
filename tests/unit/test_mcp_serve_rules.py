"""The hub as an MCP server, its pure decisions (``reach.core.interop.mcp``): tool names,
input schemas, one tool per capability, call options, submissions, progress steps and
a task's end as a tool result."""

from __future__ import annotations

from hashlib import sha256
from typing import Any

import pytest

from reach.core.interop import mcp as rules
from reach.core.interop.mcp import Scope, Tool, ToolResult
from reach.errors import PROBLEM_TYPE_PREFIX, InvalidPayload, NoSuitableAgent

P = PROBLEM_TYPE_PREFIX


@pytest.mark.parametrize(
    ("capability", "name"),
    [
        ("text.echo", "text.echo"),
        ("work_do-2", "work_do-2"),
        ("x" * 128, "x" * 128),
        ("doc/summarise:v2", "doc_summarise_v2-" + sha256(b"doc/summarise:v2").hexdigest()[:8]),
        ("a:b", "a_b-" + sha256(b"a:b").hexdigest()[:8]),
    ],
)
def test_a_capability_type_is_its_tool_name_or_a_mapped_one(capability: str, name: str) -> None:
    assert rules.tool_name(capability) == name
    assert rules.TOOL_NAME.fullmatch(name)


def test_in_a_clash_the_type_that_is_its_own_name_keeps_it() -> None:
    mapped = rules.tool_name("a:b")
    tools = rules.tools_of([("x", {"type": "a:b"}), ("y", {"type": mapped})])
    assert [(t.name, t.capability) for t in tools] == [(mapped, mapped)]


def test_mapped_names_stay_distinct_and_within_128_characters() -> None:
    names = {rules.tool_name(c) for c in ("a/b", "a:b", "a_b/", "a/b:c", "x/" + "y" * 126)}
    assert len(names) == 5
    assert all(rules.TOOL_NAME.fullmatch(n) for n in names)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (None, {"type": "object"}),
        ({}, {"type": "object"}),
        ({"type": "object", "required": ["a"]}, {"type": "object", "required": ["a"]}),
        ({"properties": {"a": {}}}, {"type": "object", "properties": {"a": {}}}),
        ({"type": "string"}, {"type": "object", "allOf": [{"type": "string"}]}),
    ],
)
def test_the_input_schema_is_the_params_schema_with_an_object_root(
    schema: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    assert rules.input_schema_of(schema) == expected


def test_one_tool_per_capability_whichever_agents_declare_it() -> None:
    decls = [
        ("b-agent", {"type": "text.echo", "description": "B's echo", "params_schema": {}}),
        ("a-agent", {"type": "text.echo", "description": "A's echo",
                     "params_schema": {"type": "object", "required": ["text"]}}),
        ("a-agent", {"type": "orders.cancel"}),
        ("c-agent", {"type": "doc/sum"}),
    ]  # fmt: skip
    tools = {t.capability: t for t in rules.tools_of(decls, needs_approval=["orders.cancel"])}
    echo = tools["text.echo"]
    assert echo.agents == ("a-agent", "b-agent")  # the first in agent order describes it
    assert echo.description == "A's echo"
    assert echo.input_schema == {"type": "object", "required": ["text"]}
    assert echo.meta() == {"reach/capability": "text.echo", "reach/agents": ["a-agent", "b-agent"]}
    cancel = tools["orders.cancel"]
    assert cancel.approval and "human approval" in cancel.description
    assert "orders.cancel of a-agent" in cancel.description  # no description of its own
    assert not echo.approval
    assert tools["doc/sum"].name.startswith("doc_sum-")
    assert [t.name for t in rules.tools_of(decls)] == sorted(t.name for t in tools.values())


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, rules.CallOptions(30_000, False)),
        ({}, rules.CallOptions(30_000, False)),
        ({"_meta": {"progressToken": "p1"}}, rules.CallOptions(30_000, True)),
        ({"_meta": {"progressToken": 7}}, rules.CallOptions(30_000, True)),
        ({"_meta": {"progressToken": True}}, rules.CallOptions(30_000, False)),
        ({"_meta": {"reach/timeout_ms": 5000}}, rules.CallOptions(5000, False)),
        ({"_meta": "nonsense"}, rules.CallOptions(30_000, False)),
        ({"_meta": {"reach/session_id": "s-1"}}, rules.CallOptions(30_000, False, "s-1")),
    ],
)
def test_call_options_come_from_the_calls_meta(
    params: dict[str, Any] | None, expected: rules.CallOptions
) -> None:
    assert rules.call_options(params) == expected


@pytest.mark.parametrize("bad", [0, -1, 3_600_001, "5000", 1.5, True, None])
def test_a_bad_timeout_is_refused_with_its_key_named(bad: object) -> None:
    with pytest.raises(ValueError, match="reach/timeout_ms"):
        rules.call_options({"_meta": {"reach/timeout_ms": bad}})


@pytest.mark.parametrize("bad", ["", "s" * 129, 7, ["s"]])
def test_a_bad_session_is_refused_with_its_key_named(bad: object) -> None:
    with pytest.raises(ValueError, match="reach/session_id"):
        rules.call_options({"_meta": {"reach/session_id": bad}})


TOOL = Tool("text.echo", "text.echo", "echo", {"type": "object"}, ("a",))


@pytest.mark.parametrize(
    ("scope", "target"),
    [
        (Scope(), {}),
        (Scope(agent_id="a"), {"agent_id": "a"}),
        (Scope(tags=("t1", "t2")), {"tags": ["t1", "t2"]}),
        (Scope(capability="text.echo"), {}),
    ],
)
def test_a_call_is_a_submission_routed_by_capability_within_the_scope(
    scope: Scope, target: dict[str, Any]
) -> None:
    body = rules.submission(scope, TOOL, {"text": "hi"}, rules.CallOptions(1234))
    assert body == {
        "capability": "text.echo",
        "method": "text.echo",
        "payload": {"text": "hi"},
        "timeout_ms": 1234,
        **target,
    }
    assert rules.submission(scope, TOOL, None, rules.CallOptions())["payload"] == {}
    in_session = rules.submission(scope, TOOL, None, rules.CallOptions(session_id="s-1"))
    assert in_session["session_id"] == "s-1"


@pytest.mark.parametrize(
    ("progress", "message", "last", "step"),
    [
        (0.5, "half", 0.0, (0.5, 1.0, "half")),
        (0.5, "", 0.0, (0.5, 1.0, None)),
        (0.5, "again", 0.5, None),  # not past the last one sent
        (0.2, "retry", 0.5, None),  # a retry starting over
        (1.5, "over", 0.5, (1.0, 1.0, "over")),
        (None, "no fraction", 0.0, None),
        (True, "a bool", 0.0, None),
        ("0.7", "a string", 0.0, None),
    ],
)
def test_progress_reports_that_move_on_are_notifications(
    progress: object, message: object, last: float, step: object
) -> None:
    assert rules.progress_step(progress, message, last) == step


def view(status: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": "t-1", "status": status, **extra}


@pytest.mark.parametrize(
    ("task", "error", "text", "structured"),
    [
        (view("success", result={"a": 1}), False, '{"a": 1}', {"a": 1}),
        (view("success", result="plain"), False, "plain", {"result": "plain"}),
        (view("success", result=[1, 2]), False, "[1, 2]", {"result": [1, 2]}),
        (view("success", result=None), False, "null", {"result": None}),
        (
            view("failed", error={"kind": "business", "code": 7, "message": "unsupported"}),
            True, "business-error: unsupported",
            {"type": P + "business-error", "status": 422, "detail": "unsupported",
             "task_id": "t-1", "code": 7},
        ),
        (
            view("failed", error={"kind": "approval_rejected", "message": "no way",
                                  "approval_id": "ap-1", "reason": "risky"}),
            True, "approval-rejected: no way",
            {"type": P + "approval-rejected", "status": 403, "detail": "no way",
             "task_id": "t-1", "approval_id": "ap-1", "reason": "risky"},
        ),
        (
            view("failed", error={"kind": "approval_expired", "approval_id": "ap-2"}),
            True, "approval-expired: task t-1: nobody approved it in time",
            {"type": P + "approval-expired", "status": 410,
             "detail": "task t-1: nobody approved it in time", "task_id": "t-1",
             "approval_id": "ap-2"},
        ),
        (
            view("dead", error={"kind": "transient", "message": "HTTP 500"}),
            True,
            "dead-lettered: task t-1 was dead-lettered after its retries: transient: HTTP 500",
            {"type": P + "dead-lettered", "status": 502,
             "detail": "task t-1 was dead-lettered after its retries: transient: HTTP 500",
             "task_id": "t-1", "cause": "transient"},
        ),
        (
            view("cancelled", error={"kind": "session_closed", "session_id": "s-1"}),
            True, "session-closed: task t-1: its session was closed",
            {"type": P + "session-closed", "status": 410,
             "detail": "task t-1: its session was closed", "task_id": "t-1",
             "session_id": "s-1"},
        ),
        (
            view("cancelled", error={"kind": "cancelled", "message": "by its caller"}),
            True, "task-cancelled: by its caller",
            {"type": rules.CANCELLED, "status": 409, "detail": "by its caller",
             "task_id": "t-1"},
        ),
        (
            view("executing"),
            True, "result-timeout: task t-1 is still executing after 2.5 s; "
            "its result: GET /v1/tasks/t-1",
            {"type": P + "result-timeout", "status": 408,
             "detail": "task t-1 is still executing after 2.5 s; its result: GET /v1/tasks/t-1",
             "task_id": "t-1", "task_status": "executing"},
        ),
    ],
)  # fmt: skip
def test_a_tasks_end_is_the_tools_result(
    task: dict[str, Any], error: bool, text: str, structured: dict[str, Any]
) -> None:
    result = rules.outcome_of(task, 2.5)
    assert result == ToolResult(text, structured, error, "t-1")
    assert result.meta() == {"reach/task_id": "t-1"}


def test_a_refused_submit_is_a_tool_error_with_its_problem_type() -> None:
    refused = rules.refusal(InvalidPayload("payload does not satisfy params_schema", method="m"))
    assert refused.is_error and refused.task_id is None and refused.meta() == {}
    assert refused.structured == {
        "type": P + "invalid-payload",
        "status": 422,
        "detail": "payload does not satisfy params_schema",
        "task_id": None,
        "method": "m",
    }
    assert rules.refusal(NoSuitableAgent("nobody")).text == "no-suitable-agent: nobody"


def test_a_gated_call_is_awaiting_approval_not_an_error() -> None:
    parked = rules.awaiting_approval("t-9", "ap-9")
    assert not parked.is_error
    assert parked.structured == {
        "status": "awaiting_approval",
        "task_id": "t-9",
        "approval_id": "ap-9",
    }
    assert "ap-9" in parked.text and "t-9" in parked.text


def test_a_scope_describes_itself() -> None:
    assert Scope().describe() == "the whole hub"
    assert Scope("a", ("t",), "c").describe() == "agent a, tag t, capability c"


@pytest.mark.parametrize(
    ("host", "origin", "refused"),
    [
        ("127.0.0.1:8800", None, None),
        ("localhost:8800", "http://localhost:8800", None),
        ("[::1]:8800", "https://[::1]", None),
        ("127.0.0.1", "http://127.0.0.1:3000", None),  # another local port: still loopback
        ("evil.example:8800", None, "Host"),  # rebinding: the page's own name
        ("evil.example", "http://127.0.0.1:8800", "Host"),
        ("127.0.0.1:8800", "http://evil.example", "Origin"),
        ("127.0.0.1:8800", "null", "Origin"),
        ("127.0.0.1:8800", "file:///x", "Origin"),
        (None, None, "Host"),
        ("[::1", None, "Host"),
        ("127.0.0.1:8800", "http://[::1", "Origin"),
        ("0.0.0.0:8800", None, "Host"),
    ],
)
def test_an_open_hubs_endpoint_takes_loopback_names_only(
    host: str | None, origin: str | None, refused: str | None
) -> None:
    why = rules.rebinding_refusal(host, origin)
    assert (why is None) if refused is None else (why is not None and why.startswith(refused))
