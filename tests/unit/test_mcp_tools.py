"""An MCP server's tools as capabilities, a tool's result as an envelope, and what a
re-read tool list may change (``reach.core.interop.mcp.servers``)."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.delivery.retry import Outcome, classify
from reach.core.interop.mcp import servers as mcp

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (
            {"name": "echo", "description": "Echo it", "inputSchema": SCHEMA},
            {"type": "echo", "description": "Echo it", "params_schema": SCHEMA},
        ),
        (
            {"name": "orders.cancel", "title": "Cancel an order"},
            {
                "type": "orders.cancel",
                "description": "Cancel an order",
                "params_schema": {"type": "object"},
            },
        ),
        ({"name": "_private"}, "is not a name"),
        ({"name": "a/../b"}, "is a path"),
        ({"name": "x" * 129}, "longer than 128"),
        ({"description": "no name"}, "has no name"),
        ({"name": "bad", "inputSchema": ["not", "an", "object"]}, "not a JSON object"),
    ],
)
def test_a_tool_is_a_capability_of_its_name_or_a_reason(
    tool: dict[str, Any], expected: dict[str, Any] | str
) -> None:
    got = mcp.capability_of(tool)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got
    else:
        assert got == expected


def test_a_tool_list_keeps_its_order_and_says_what_it_left_out() -> None:
    declared, skipped = mcp.capabilities_of(
        [{"name": "b"}, {"name": "a"}, {"name": "-x"}, {"name": "b"}]
    )
    assert [c["type"] for c in declared] == ["b", "a"]
    assert set(skipped) == {"-x", "b"} and skipped["b"] == "listed twice"


@pytest.mark.parametrize(
    ("result", "envelope", "outcome"),
    [
        (
            {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"n": 1}},
            {"code": 0, "data": {"n": 1}},
            Outcome.SUCCESS,
        ),
        (
            {"content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}]},
            {"code": 0, "data": {"text": "hello\nagain"}},
            Outcome.SUCCESS,
        ),
        (
            {"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]},
            {
                "code": 0,
                "data": {
                    "text": "",
                    "content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}],
                },
            },
            Outcome.SUCCESS,
        ),
        (
            {"content": [{"type": "text", "text": "no such order"}], "isError": True},
            {"code": mcp.BUSINESS_CODE, "message": "no such order"},
            Outcome.BUSINESS_ERROR,
        ),
        (
            {"content": [], "isError": True},
            {"code": mcp.BUSINESS_CODE, "message": "the tool reported an error"},
            Outcome.BUSINESS_ERROR,
        ),
        (
            {"structuredContent": None, "content": []},
            {"code": 0, "data": {"text": ""}},
            Outcome.SUCCESS,
        ),
    ],
)
def test_a_tool_result_is_an_envelope(
    result: dict[str, Any], envelope: dict[str, Any], outcome: Outcome
) -> None:
    assert mcp.envelope_of(result) == envelope
    assert classify(200, envelope) is outcome


@pytest.mark.parametrize(
    ("code", "transient"), [(-32000, True), (-32001, True), (-32603, True), (-32602, False),
                            (-32601, False), (42, False)],
)  # fmt: skip
def test_a_json_rpc_error_is_transient_or_the_calls_business_error(
    code: int, transient: bool
) -> None:
    envelope = mcp.rpc_error_envelope(code, "Unknown tool: x")
    if transient:
        assert envelope is None
    else:
        assert envelope is not None and classify(200, envelope) is Outcome.BUSINESS_ERROR
        assert "Unknown tool: x" in envelope["message"]


@pytest.mark.parametrize(
    ("progress", "total", "fraction"),
    [(1, 4, 0.25), (4, 4, 1.0), (5, 4, 1.0), (3, None, None), (3, 0, None), (-1, 2, 0.0)],
)
def test_progress_as_a_fraction(
    progress: float, total: float | None, fraction: float | None
) -> None:
    assert mcp.progress_fraction(progress, total) == fraction


@pytest.mark.parametrize(
    ("registered", "listed", "owners", "trust", "declared", "added", "removed", "held"),
    [
        # nothing changed
        (["a", "b"], ["a", "b"], {}, "L2", ("a", "b"), (), (), {}),
        # a new tool nobody owns is added; a gone one removed
        (["a", "b"], ["a", "c"], {}, "L2", ("a", "c"), ("c",), ("b",), {}),
        # a new tool an L1 agent owns is held, not taken over
        (["a"], ["a", "pay"], {"pay": [("ledger", "L1")]}, "L2", ("a",), (), (), {"pay": "ledger"}),
        # ... and so is one an agent of the same trust owns
        (["a"], ["a", "pay"], {"pay": [("peer", "L2")]}, "L2", ("a",), (), (), {"pay": "peer"}),
        # an agent of lower trust does not hold it back
        (["a"], ["a", "pay"], {"pay": [("plugin", "L3")]}, "L2", ("a", "pay"), ("pay",), (), {}),
        # a tool it was registered with stays, whoever else declares it
        (["pay"], ["pay"], {"pay": [("ledger", "L1")]}, "L2", ("pay",), (), (), {}),
        # an L3 server is held back by anyone
        ([], ["x"], {"x": [("b", "L3"), ("a", "L3")]}, "L3", (), (), (), {"x": "a"}),
    ],
)
def test_what_a_reread_tool_list_may_change(
    registered: list[str],
    listed: list[str],
    owners: dict[str, list[tuple[str, str]]],
    trust: str,
    declared: tuple[str, ...],
    added: tuple[str, ...],
    removed: tuple[str, ...],
    held: dict[str, str],
) -> None:
    plan = mcp.refresh_plan(registered, listed, owners, trust)
    assert (plan.declared, plan.added, plan.removed, plan.held) == (declared, added, removed, held)
    assert plan.changed == bool(added or removed)


@pytest.mark.parametrize(
    ("name", "agent_id"), [("Tool Server", "tool-server"), ("__", "mcp-server"), ("A.b_c", "a.b_c")]
)
def test_the_agent_id_from_the_server_name(name: str, agent_id: str) -> None:
    assert mcp.agent_id_of(name) == agent_id
