"""What ``reach approvals list|show`` print for the hub's approval views."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from reach.cli.rendering import (
    APPROVAL_STYLE,
    approval_lines,
    approval_state_line,
    approvals_table,
)
from reach.core.ledger.statuses import ApprovalStatus

REQUESTED = 1_767_225_600.0  # 2026-01-01 00:00:00Z


def _text(renderable: Table | str) -> str:
    console = Console(record=True, width=250, color_system=None)
    console.print(renderable)
    return console.export_text()


def _approval(**overrides: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "approval_id": "ap-0123456789",
        "task_id": "t-cancel-1",
        "capability": "orders.cancel",
        "method": "orders.cancel",
        "agent_id": "shop",
        "caller": "key:callerkey0001",
        "payload_hash": "ab" * 32,
        "requested_at": REQUESTED,
        "expires_at": REQUESTED + 3600,
        "status": "pending",
        "decided_by": None,
        "decided_name": None,
        "decided_at": None,
        "reason": None,
    }
    view.update(overrides)
    return view


def test_a_pending_approval_is_a_row_with_every_column() -> None:
    table = approvals_table([_approval()])
    headers = [c.header for c in table.columns]
    assert headers == [
        "approval",
        "task",
        "capability",
        "agent",
        "caller",
        "requested",
        "expires",
        "status",
        "decided by",
    ]
    text = _text(table)
    for cell in (
        "ap-0123456789",
        "t-cancel-1",
        "orders.cancel",
        "shop",
        "key:callerkey0001",
        "2026-01-01 00:00:00Z",
        "2026-01-01 01:00:00Z",
        "pending",
    ):
        assert cell in text
    row = [str(c._cells[0]) for c in table.columns]
    assert row[7] == "[yellow]pending[/yellow]" and row[8] == "-"


@pytest.mark.parametrize(
    ("by", "name", "cell"),
    [
        ("key:approverkey01", "alice", "key:approverkey01 (alice)"),
        ("key:approverkey01", None, "key:approverkey01"),
        ("key:approverkey01", "key:approverkey01", "key:approverkey01"),
        (None, None, "-"),
    ],
)
def test_decided_by_names_the_identity_and_the_display_name(
    by: str | None, name: str | None, cell: str
) -> None:
    table = approvals_table([_approval(status="approved", decided_by=by, decided_name=name)])
    assert str(table.columns[8]._cells[0]) == cell


@pytest.mark.parametrize("status", list(ApprovalStatus))
def test_every_status_has_a_colour(status: ApprovalStatus) -> None:
    table = approvals_table([_approval(status=status.value)])
    style = APPROVAL_STYLE[status.value]
    assert str(table.columns[7]._cells[0]) == f"[{style}]{status.value}[/{style}]"


def test_missing_agent_and_caller_show_a_dash_and_no_rows_is_an_empty_table() -> None:
    table = approvals_table([_approval(agent_id=None, caller=None)])
    assert str(table.columns[3]._cells[0]) == "-" and str(table.columns[4]._cells[0]) == "-"
    assert approvals_table([]).row_count == 0


def test_markup_in_hub_strings_is_printed_literally() -> None:
    """A caller identity or capability is data, never rich markup (``[red]`` stays text)."""
    table = approvals_table([_approval(caller="agent:[red]x[/red]", capability="a.[b]")])
    text = _text(table)
    assert "agent:[red]x[/red]" in text and "a.[b]" in text


def test_show_of_a_pending_approval_has_no_decision_lines() -> None:
    lines = approval_lines(_approval())
    text = "\n".join(lines)
    assert lines[0] == "[bold]approval ap-0123456789[/bold]  [yellow]pending[/yellow]"
    assert "payload sha256: " + "ab" * 32 in text
    assert "expires:        2026-01-01 01:00:00Z" in text
    assert "decided" not in text and "reason" not in text


def test_show_of_a_rejection_says_who_when_and_why() -> None:
    lines = approval_lines(
        _approval(
            status="rejected",
            decided_by="key:approverkey01",
            decided_name="alice",
            decided_at=REQUESTED + 60,
            reason="customer [VIP] asked to keep it",
        )
    )
    assert lines[0].endswith("[red]rejected[/red]")
    assert "decided by:     key:approverkey01 (alice)" in lines
    assert "decided at:     2026-01-01 00:01:00Z" in lines
    assert "customer [VIP] asked to keep it" in _text("\n".join(lines))


def _event(kind: str, at: float, **detail: Any) -> dict[str, Any]:
    return {"kind": kind, "at": at, "attempt_seq": 1, "agent_id": "shop", "detail": detail}


REQUESTED_EVENT = _event(
    "approval_requested", REQUESTED, approval_id="ap-1", expires_at=REQUESTED + 3600
)


@pytest.mark.parametrize(
    ("events", "line"),
    [
        ([_event("submitted", REQUESTED)], None),
        (
            [REQUESTED_EVENT],
            "approval ap-1  [yellow]pending[/yellow]  expires 2026-01-01 01:00:00Z  "
            "(decide with `reach approvals approve|reject ap-1`)",
        ),
        (
            [
                REQUESTED_EVENT,
                _event(
                    "approval_granted",
                    REQUESTED + 60,
                    approval_id="ap-1",
                    decided_by="key:k1",
                    decided_name="alice",
                ),
                _event("delivered", REQUESTED + 61),
            ],
            "approval ap-1  [green]approved[/green]  by key:k1 (alice) at 2026-01-01 00:01:00Z",
        ),
        (
            [
                REQUESTED_EVENT,
                _event(
                    "approval_rejected",
                    REQUESTED + 120,
                    approval_id="ap-1",
                    decided_by="key:k1",
                    decided_name=None,
                    reason="too risky",
                ),
            ],
            "approval ap-1  [red]rejected[/red]  by key:k1 at 2026-01-01 00:02:00Z: too risky",
        ),
        (
            [
                REQUESTED_EVENT,
                _event(
                    "approval_expired", REQUESTED + 3601, approval_id="ap-1", expires_at=REQUESTED
                ),
            ],
            "approval ap-1  [bright_black]expired[/bright_black]  at 2026-01-01 00:00:00Z: "
            "nobody decided in time",
        ),
    ],
)
def test_tasks_show_reads_the_approval_state_from_the_events(
    events: list[dict[str, Any]], line: str | None
) -> None:
    assert approval_state_line(events) == line
