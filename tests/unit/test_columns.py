"""Which columns a list shows in a terminal of a given width: IDs whole or not at all,
free text cut first, the least important columns dropped next; pipes get every column
tab-separated."""

from __future__ import annotations

from typing import Any

import pytest
from rich.cells import cell_len

from reach.cli.columns import (
    AGENT_COLUMNS,
    ALERT_COLUMNS,
    TASK_COLUMNS,
    Column,
    Output,
    age,
    agent_rows,
    alert_rows,
    cut,
    fit,
    shown_columns,
    table_lines,
    task_rows,
    tsv_lines,
)

NOW = 1_800_000_000.0


def _agent(agent_id: str, instance_id: str, **inst: Any) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "tags": ["docs", "eu-west"],
        "capabilities": [{"type": "analyze"}, {"type": "summarize"}],
        "instances": [
            {
                "instance_id": instance_id,
                "status": "online",
                "reach_score": 91.25,
                "endpoint": "http://10.20.30.40:7101",
                "public_endpoint": None,
                "heartbeat_age_s": 2.04,
                "current_load": 0.25,
                "in_flight": 1,
                "max_concurrency": 4,
                "version": "1.4.2",
                "probe_status": "ok",
                "breaker": "closed",
                "status_reason": "",
                **inst,
            }
        ],
    }


FLEET = [
    _agent("doc-analyzer-01", "5f2c9a7e31b04d8e9a61c3f0"),
    _agent("accounts-payable-reconciler-eu-west-1", "c0ffee00c0ffee00c0ffee00"),
    {"agent_id": "pay-01", "tags": [], "capabilities": [], "instances": []},
]


def headers(layout: list[tuple[Column, int]]) -> list[str]:
    return [c.header for c, _ in layout]


def rendered(layout: list[tuple[Column, int]], rows: list[dict[str, str]]) -> list[str]:
    return [t.plain for t in table_lines(layout, rows)]


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (80, ["AGENT", "INSTANCE", "STATUS", "SCORE", "HEARTBEAT"]),  # 78 cells
        (
            120,
            ["AGENT", "INSTANCE", "STATUS", "SCORE", "IN FLIGHT", "HEARTBEAT", "LOAD", "ENDPOINT"],
        ),
        (
            200,
            [
                "AGENT",
                "INSTANCE",
                "STATUS",
                "SCORE",
                "IN FLIGHT",
                "HEARTBEAT",
                "LOAD",
                "ENDPOINT",
                "CAPABILITIES",
                "TAGS",
            ],
        ),
    ],
)
def test_agents_fit_the_terminal_without_cutting_an_id(width: int, expected: list[str]) -> None:
    rows = agent_rows(FLEET, whole_ids=False)
    layout = fit(shown_columns(AGENT_COLUMNS, Output.TABLE), rows, width)
    assert headers(layout) == expected
    lines = rendered(layout, rows)
    assert all(cell_len(line) <= width for line in lines), lines
    text = "\n".join(lines)
    assert "…" not in text.split("CAPABILITIES")[0]  # nothing cut before the free text
    for agent in ("doc-analyzer-01", "accounts-payable-reconciler-eu-west-1", "pay-01"):
        assert any(line.startswith(agent + " ") for line in lines)
    assert "5f2c9a7e31b0 " in text and "5f2c9a7e31b04" not in text  # 12 characters


def test_free_text_is_cut_before_a_column_is_dropped() -> None:
    columns = [
        Column("id", "ID"),
        Column("status", "STATUS", priority=1),
        Column("reason", "REASON", priority=2, shrink=True, min_width=10),
    ]
    rows = [{"id": "task-0001", "status": "failed", "reason": "connection refused by 10.0.0.7:80"}]
    natural = 9 + 2 + 6 + 2 + 33
    assert fit(columns, rows, natural) == [(columns[0], 9), (columns[1], 6), (columns[2], 33)]
    layout = fit(columns, rows, 40)
    assert layout == [(columns[0], 9), (columns[1], 6), (columns[2], 21)]
    assert rendered(layout, rows)[1] == "task-0001  failed  connection refused b…"
    # below the free text's floor (10): the least important column goes, whole
    assert headers(fit(columns, rows, 28)) == ["ID", "STATUS"]
    assert headers(fit(columns, rows, 12)) == ["ID"]


@pytest.mark.parametrize("width", [1, 10, 20])
def test_required_columns_are_never_cut_even_past_the_width(width: int) -> None:
    columns = [Column("id", "ID"), Column("kind", "KIND"), Column("x", "X", priority=1)]
    rows = [{"id": "accounts-payable-reconciler-eu-west-1", "kind": "offline", "x": "1"}]
    layout = fit(columns, rows, width)
    assert layout == [(columns[0], 37), (columns[1], 7)]
    assert rendered(layout, rows)[1] == "accounts-payable-reconciler-eu-west-1  offline"


def test_of_equally_unimportant_columns_the_rightmost_goes_first() -> None:
    columns = [Column("a", "A"), Column("b", "BBBB", priority=1), Column("c", "CCCC", priority=1)]
    assert headers(fit(columns, [], 8)) == ["A", "BBBB"]


def test_wide_shows_every_column_and_table_leaves_wide_ones_out() -> None:
    assert "VERSION" not in [c.header for c in shown_columns(AGENT_COLUMNS, Output.TABLE)]
    assert [c.header for c in shown_columns(AGENT_COLUMNS, Output.WIDE)][-4:] == [
        "VERSION",
        "PROBE",
        "BREAKER",
        "REASON",
    ]
    rows = agent_rows(FLEET, whole_ids=True)
    assert rows[0]["instance"] == "5f2c9a7e31b04d8e9a61c3f0"


def test_a_pipe_gets_every_value_whole_tab_separated() -> None:
    columns = shown_columns(AGENT_COLUMNS, Output.TABLE)
    lines = tsv_lines(columns, agent_rows(FLEET, whole_ids=True))
    assert lines[0].split("\t") == [c.header for c in columns]
    first = lines[1].split("\t")
    assert first[:3] == ["doc-analyzer-01", "5f2c9a7e31b04d8e9a61c3f0", "online"]
    assert first[-2:] == ["analyze,summarize", "docs,eu-west"]
    assert lines[3].split("\t")[:3] == ["pay-01", "-", "offline"]
    assert [line for line in lines if "doc-analyzer-01" in line] == [lines[1]]  # grep finds it
    assert tsv_lines([Column("m", "M")], [{"m": "a\tb\nc"}]) == ["M", "a b c"]


def test_an_agent_without_instances_is_one_offline_row() -> None:
    (row,) = agent_rows([FLEET[2]], whole_ids=False)
    assert row["instance"] == "-" and row["status"] == "offline"


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (80, ["TASK", "STATUS", "CAPABILITY", "AGENT", "CREATED"]),  # exactly 80
        (120, ["TASK", "STATUS", "CAPABILITY", "AGENT", "CREATED", "CALLER", "ERROR"]),
        (
            200,
            [
                "TASK",
                "STATUS",
                "CAPABILITY",
                "AGENT",
                "CREATED",
                "RETRIES",
                "CALLER",
                "SESSION",
                "ERROR",
            ],
        ),
    ],
)
def test_tasks_fit(width: int, expected: list[str]) -> None:
    tasks = [
        {
            "task_id": f"t-{i:032x}",
            "status": "failed",
            "method": "analyze",
            "agent_id": "doc-analyzer-01",
            "created_at": NOW - 3600,
            "retries": 5,
            "caller": "key:0123456789abcdef",
            "session_id": "s-1",
            "error": {"kind": "transient", "message": "HTTP 503 from http://10.0.0.7:7101"},
        }
        for i in range(3)
    ]
    rows = task_rows(tasks, NOW, exact=False, whole_ids=False)
    layout = fit(shown_columns(TASK_COLUMNS, Output.TABLE), rows, width)
    assert headers(layout) == expected
    assert all(cell_len(line) <= width for line in rendered(layout, rows))
    assert rows[0]["created"] == "1h ago" and rows[0]["error"].startswith("HTTP 503")
    exact = task_rows(tasks, NOW, exact=True, whole_ids=True)
    assert exact[0]["created"] == "2027-01-15T07:00:00Z"


def test_alert_summaries_are_cut_last() -> None:
    alerts = [
        {
            "kind": "breaker_opened",
            "at": NOW - 90,
            "agent_id": "doc-analyzer-01",
            "instance_id": "5f2c9a7e31b04d8e9a61c3f0",
            "summary": "doc-analyzer-01/5f2c9a7e31b0: breaker opened: 15 of 20 answers failed",
            "details": {"failures": 15},
        }
    ]
    rows = alert_rows(alerts, NOW, exact=False, whole_ids=False)
    layout = fit(shown_columns(ALERT_COLUMNS, Output.TABLE), rows, 80)
    assert headers(layout) == ["AT", "KIND", "AGENT", "INSTANCE", "SUMMARY"]
    line = rendered(layout, rows)[1]
    assert cell_len(line) == 80 and line.endswith("…")
    assert line.startswith("1m ago  breaker_opened  doc-analyzer-01  5f2c9a7e31b0  doc-")


@pytest.mark.parametrize(
    ("at", "text"),
    [(None, "-"), (NOW, "0s ago"), (NOW - 59, "59s ago"), (NOW - 60, "1m ago"),
     (NOW - 7200, "2h ago"), (NOW - 86400 * 3, "3d ago"), (NOW + 5, "0s ago")],
)  # fmt: skip
def test_age(at: float | None, text: str) -> None:
    assert age(at, NOW) == text


def test_cut_counts_terminal_cells() -> None:
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdef", 4) == "abc…"
    assert cut("日本語のテキスト", 7) == "日本語…"
    assert cut("abc", 0) == ""
