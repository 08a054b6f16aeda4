"""Tables for the command line's renderers: the cells and rows the commands print."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from reach.cli.rendering import (
    agents_table,
    allow_list_lines,
    audit_tables,
    dag_table,
    dead_letters_table,
    events_table,
    score_cell,
    task_lines,
)


def _text(table: Table) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize(
    ("score", "cell"),
    [
        (None, "-"),
        (100.0, "[green]100.0[/green]"),
        (80.0, "[green]80.0[/green]"),
        (79.94, "[yellow]79.9[/yellow]"),
        (60.0, "[yellow]60.0[/yellow]"),
        (59.9, "[red]59.9[/red]"),
        (0.0, "[red]0.0[/red]"),
    ],
)
def test_score_cell(score: float | None, cell: str) -> None:
    assert score_cell(score) == cell


def _instance(**overrides: Any) -> dict[str, Any]:
    inst: dict[str, Any] = {
        "instance_id": "inst-0123456789abcdef",
        "status": "online",
        "reach_score": 91.25,
        "endpoint": "http://127.0.0.1:7101",
        "public_endpoint": None,
        "heartbeat_age_s": 2.04,
        "current_load": 0.25,
        "in_flight": 1,
        "max_concurrency": 4,
    }
    inst.update(overrides)
    return inst


@pytest.mark.parametrize(
    ("instances", "expected"),
    [
        ([], ["demo.sales", "offline", "sales, eu", "sales.fetch"]),
        (
            [_instance()],
            ["inst-0123456", "online", "91.2", "http://127.0.0.1:7101", "2.0s ago", "25%", "1/4"],
        ),
        ([_instance(public_endpoint="https://sales.example")], ["https://sales.example"]),
        ([_instance(status="degraded", reach_score=None)], ["degraded", " - "]),
    ],
    ids=["no-instances", "online", "public-endpoint", "no-score"],
)
def test_agents_table_rows(instances: list[dict[str, Any]], expected: list[str]) -> None:
    agent = {
        "agent_id": "demo.sales",
        "tags": ["sales", "eu"],
        "capabilities": [{"type": "sales.fetch"}],
        "instances": instances,
    }
    text = _text(agents_table([agent]))
    for fragment in expected:
        assert fragment in text


def test_task_lines_show_result_and_error_only_when_present() -> None:
    task = {
        "task_id": "t1",
        "status": "failed",
        "method": "m",
        "agent_id": "a",
        "attempt_seq": 2,
        "retries": 1,
        "result": None,
        "error": {"code": 5},
    }
    assert task_lines(task) == [
        "[bold]t1[/bold]  failed  method=m  agent=a  attempt=2  retries=1",
        'error: {"code": 5}',
    ]


def test_events_and_dead_letters_tables() -> None:
    events = _text(
        events_table(
            [
                {
                    "at": 1.5,
                    "kind": "dispatched",
                    "attempt_seq": 1,
                    "agent_id": None,
                    "instance_id": None,
                    "detail": {"x": 1},
                }
            ]
        )
    )
    assert "1.500" in events and "dispatched" in events and '{"x": 1}' in events
    rows = [
        {
            "id": 7,
            "task_id": "t7",
            "agent_id": "a",
            "method": "m",
            "attempts": 3,
            "reason": "exhausted",
            "replayed_at": 12.0,
        }
    ]
    letters = _text(dead_letters_table(rows))
    assert "t7" in letters and "exhausted" in letters and "yes" in letters


def test_dag_table_shows_nodes_and_the_run_reason() -> None:
    run = {
        "name": "flow",
        "run_id": "r1",
        "status": "failed",
        "reason": "node 'b' failed",
        "nodes": [
            {"node_id": "a", "status": "success", "task_id": "t-a", "reason": ""},
            {"node_id": "b", "status": "skipped", "task_id": None, "reason": None},
        ],
    }
    text = _text(dag_table(run))
    assert "flow  r1  failed" in text
    assert "node 'b' failed" in text
    assert "t-a" in text and "skipped" in text


@pytest.mark.parametrize(
    ("changed", "suffix"), [(None, ""), (True, "  (changed)"), (False, "  (unchanged)")]
)
def test_allow_list_lines(changed: bool | None, suffix: str) -> None:
    view: dict[str, Any] = {
        "agent_id": "plug",
        "trust_level": "L3",
        "call": ["search.*", "echo"],
        "callable_by": [],
    }
    if changed is not None:
        view["changed"] = changed
    assert allow_list_lines(view) == [
        f"[bold]plug[/bold]  trust=L3{suffix}",
        "may call:       search.*, echo",
        "callable by:    -",
    ]


def test_audit_tables_show_each_identity_and_the_audit_log_only_when_it_has_rows() -> None:
    trail: dict[str, Any] = {
        "task_id": "t1",
        "status": "success",
        "identities": ["hub", "key:abc"],
        "events": [
            {
                "at": 1.25,
                "actor": "key:abc",
                "kind": "accepted",
                "outcome": "accepted",
                "agent_id": None,
                "instance_id": None,
                "attempt_seq": 1,
            },
            {
                "at": 2.0,
                "actor": "hub",
                "kind": "terminal_success",
                "outcome": "success",
                "agent_id": "plug",
                "instance_id": "inst-0123456789abcdef",
                "attempt_seq": 1,
            },
        ],
        "audit": [],
    }
    [events] = audit_tables(trail)
    text = _text(events)
    for fragment in ("audit of t1  success", "identities: hub, key:abc", "key:abc", "inst-0123456"):
        assert fragment in text
    trail["audit"] = [
        {
            "at": 1.5,
            "actor": "key:abc",
            "action": "reach",
            "target": "agent:plug",
            "outcome": "refused",
            "detail": {"stage": "submit"},
        }
    ]
    _, log = audit_tables(trail)
    text = _text(log)
    assert "agent:plug" in text and "refused" in text and '"stage": "submit"' in text


def test_task_lines_show_the_priority() -> None:
    task = {"task_id": "t1", "status": "pending", "method": "m", "agent_id": "a",
            "attempt_seq": 1, "retries": 0, "priority": "background"}  # fmt: skip
    assert task_lines(task)[0].endswith("retries=0  priority=background")
