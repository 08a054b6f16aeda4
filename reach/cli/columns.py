"""Lists on the command line: which columns fit the terminal, and the rows they show.

Pure (no I/O): the commands (`reach agents`, `reach tasks list`, `reach dag list`,
`reach alerts`) fetch, pick an `Output`, and print what these functions return.

The rules, for a terminal of ``width`` columns (`fit`):

* an ID is never cut: ``doc-analyzer-01`` is shown whole or the column is not shown at
  all (and the columns that must be shown are shown whole, even past the width);
* when the columns do not fit, free text (a reason, an error, tags) is cut first, down
  to its ``min_width``, then the least important column is dropped (highest
  ``priority``), and again, until they fit;
* instance IDs are shown as their first 12 characters, as container IDs are
  (``-o wide`` and ``-o json`` show them whole);
* when stdout is not a terminal, rows are printed as tab-separated values with every
  column whole (`tsv_lines`), so ``reach agents | grep doc-analyzer-01`` finds the agent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.text import Text

__all__ = [
    "AGENT_COLUMNS",
    "ALERT_COLUMNS",
    "DAG_RUN_COLUMNS",
    "SHORT_ID",
    "TASK_COLUMNS",
    "Column",
    "Output",
    "age",
    "agent_rows",
    "alert_rows",
    "dag_run_rows",
    "fit",
    "shown_columns",
    "table_lines",
    "task_rows",
    "tsv_lines",
]

SHORT_ID = 12
GAP = 2
ELLIPSIS = "…"


class Output(StrEnum):
    """``-o``: a table fitted to the terminal, every column (``wide``) or the hub's JSON."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class Column:
    """One column: the row key it shows, its header, how much it matters (0: always
    shown; higher numbers are dropped first), whether it is free text that may be cut
    (never an ID) and how far, and whether only ``-o wide`` shows it."""

    key: str
    header: str
    priority: int = 0
    shrink: bool = False
    min_width: int = 12
    wide: bool = False


def shown_columns(columns: Sequence[Column], output: Output) -> list[Column]:
    """The columns of ``output``: ``wide`` shows them all, the others leave wide ones out."""
    return [c for c in columns if output is Output.WIDE or not c.wide]


def fit(
    columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int
) -> list[tuple[Column, int]]:
    """The columns that fit in ``width`` terminal cells, each with its width (see the
    module docstring for the rules). Columns keep their order."""
    natural = {
        c.key: max([cell_len(c.header)] + [cell_len(r.get(c.key, "")) for r in rows])
        for c in columns
    }
    shown = list(columns)
    while True:
        gaps = GAP * (len(shown) - 1)
        need = sum(natural[c.key] for c in shown) + gaps
        if need <= width:
            return [(c, natural[c.key]) for c in shown]
        floor = {c.key: _floor(c, natural[c.key]) for c in shown}
        if sum(floor.values()) + gaps <= width or not any(c.priority > 0 for c in shown):
            return _shrunk(shown, natural, floor, need - width)
        # drop the least important column (of equal ones, the rightmost)
        drop = max(reversed(shown), key=lambda c: c.priority)
        shown.remove(drop)


def _floor(column: Column, natural: int) -> int:
    if not column.shrink:
        return natural
    return min(natural, max(column.min_width, cell_len(column.header)))


def _shrunk(
    shown: list[Column], natural: dict[str, int], floor: dict[str, int], excess: int
) -> list[tuple[Column, int]]:
    """Cut the free-text columns, widest first, by ``excess`` cells (or to their floor)."""
    widths = {c.key: natural[c.key] for c in shown}
    while excess > 0:
        cuttable = [c for c in shown if widths[c.key] > floor[c.key]]
        if not cuttable:
            break
        widest = max(cuttable, key=lambda c: widths[c.key] - floor[c.key])
        widths[widest.key] -= 1
        excess -= 1
    return [(c, widths[c.key]) for c in shown]


def cut(value: str, width: int) -> str:
    """``value`` in at most ``width`` cells, ``…`` marking a cut."""
    if cell_len(value) <= width:
        return value
    return set_cell_size(value, max(0, width - 1)) + ELLIPSIS if width > 0 else ""


def table_lines(
    layout: Sequence[tuple[Column, int]],
    rows: Sequence[Mapping[str, str]],
    styles: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Text]:
    """A header and one line per row, columns padded to their widths; ``styles`` maps a
    column key to {cell value: rich style} (a status colour)."""
    styles = styles or {}
    header = Text()
    for i, (column, width) in enumerate(layout):
        header.append(_pad(column.header, width, last=i == len(layout) - 1), style="bold")
    lines = [header]
    for row in rows:
        line = Text()
        for i, (column, width) in enumerate(layout):
            value = row.get(column.key, "")
            style = styles.get(column.key, {}).get(value, "")
            line.append(_pad(cut(value, width), width, last=i == len(layout) - 1), style=style)
        lines.append(line)
    return lines


def _pad(value: str, width: int, *, last: bool) -> str:
    if last:
        return value  # no trailing blanks
    return value + " " * (width - cell_len(value) + GAP)


def tsv_lines(columns: Sequence[Column], rows: Sequence[Mapping[str, str]]) -> list[str]:
    """A header and one tab-separated line per row, every value whole (tabs and line
    breaks inside a value become spaces)."""
    out = ["\t".join(c.header for c in columns)]
    out.extend("\t".join(_clean(row.get(c.key, "")) for c in columns) for row in rows)
    return out


def _clean(value: str) -> str:
    return value.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def age(at: float | None, now: float) -> str:
    """How long ago, in one unit: ``45s ago``, ``12m ago``, ``3h ago``, ``9d ago``."""
    if at is None:
        return "-"
    seconds = max(0.0, now - at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def iso(at: float | None) -> str:
    """An epoch time as ISO 8601 UTC to the second (what a pipe gets instead of an age)."""
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(at: float | None, now: float, *, exact: bool) -> str:
    return iso(at) if exact else age(at, now)


def _short(instance_id: str | None, *, whole: bool) -> str:
    if not instance_id:
        return "-"
    return instance_id if whole else instance_id[:SHORT_ID]


# -- agents -----------------------------------------------------------------------------

AGENT_COLUMNS = (
    Column("agent", "AGENT"),
    Column("instance", "INSTANCE"),
    Column("status", "STATUS"),
    Column("score", "SCORE", priority=1),
    Column("in_flight", "IN FLIGHT", priority=3),
    Column("heartbeat", "HEARTBEAT", priority=2),
    Column("load", "LOAD", priority=5),
    Column("endpoint", "ENDPOINT", priority=4),
    Column("capabilities", "CAPABILITIES", priority=6, shrink=True),
    Column("tags", "TAGS", priority=7, shrink=True),
    Column("version", "VERSION", wide=True),
    Column("probe", "PROBE", wide=True),
    Column("breaker", "BREAKER", wide=True),
    Column("reason", "REASON", wide=True, shrink=True),
)


def agent_rows(agents: Sequence[Mapping[str, Any]], *, whole_ids: bool) -> list[dict[str, str]]:
    """One row per instance of ``GET /api/v1/agents``'s agents (one ``offline`` row for an
    agent with none); ``whole_ids`` shows instance IDs whole (wide output, pipes)."""
    rows = []
    for agent in agents:
        base = {
            "agent": str(agent["agent_id"]),
            "capabilities": ",".join(str(c.get("type")) for c in agent.get("capabilities") or []),
            "tags": ",".join(str(t) for t in agent.get("tags") or []) or "-",
        }
        instances = agent.get("instances") or []
        if not instances:
            rows.append({**base, "instance": "-", "status": "offline", "score": "-"})
        for inst in instances:
            score = inst.get("reach_score")
            rows.append(
                {
                    **base,
                    "instance": _short(inst.get("instance_id"), whole=whole_ids),
                    "status": str(inst.get("status")),
                    "score": "-" if score is None else f"{score:.1f}",
                    "in_flight": f"{inst.get('in_flight')}/{inst.get('max_concurrency')}",
                    "heartbeat": f"{float(inst.get('heartbeat_age_s') or 0):.1f}s ago",
                    "load": f"{float(inst.get('current_load') or 0):.0%}",
                    "endpoint": str(inst.get("public_endpoint") or inst.get("endpoint") or "-"),
                    "version": str(inst.get("version") or "-"),
                    "probe": str(inst.get("probe_status") or "-"),
                    "breaker": str(inst.get("breaker") or "-"),
                    "reason": str(inst.get("status_reason") or ""),
                }
            )
    return rows


# -- tasks, DAG runs, alerts ----------------------------------------------------------

TASK_COLUMNS = (
    Column("task", "TASK"),
    Column("status", "STATUS"),
    Column("method", "CAPABILITY", priority=1),
    Column("agent", "AGENT", priority=2),
    Column("created", "CREATED", priority=3),
    Column("retries", "RETRIES", priority=6),
    Column("caller", "CALLER", priority=4),
    Column("session", "SESSION", priority=7),
    Column("error", "ERROR", priority=5, shrink=True, min_width=16),
    Column("instance", "INSTANCE", wide=True),
    Column("priority", "PRIORITY", wide=True),
    Column("finished", "FINISHED", wide=True),
)


def task_rows(
    tasks: Sequence[Mapping[str, Any]], now: float, *, exact: bool, whole_ids: bool
) -> list[dict[str, str]]:
    """Rows of ``GET /api/v1/tasks`` items; ``exact`` prints times as ISO 8601 (pipes)
    instead of ages."""
    rows = []
    for t in tasks:
        error = t.get("error")
        message = (
            (error.get("message") or error.get("kind") or "") if isinstance(error, dict) else ""
        )
        rows.append(
            {
                "task": str(t["task_id"]),
                "status": str(t["status"]),
                "method": str(t.get("method") or "-"),
                "agent": str(t.get("agent_id") or "-"),
                "created": _when(t.get("created_at"), now, exact=exact),
                "retries": str(t.get("retries", 0)),
                "caller": str(t.get("caller") or "-"),
                "session": str(t.get("session_id") or "-"),
                "error": " ".join(str(message).split()) or "-",
                "instance": _short(t.get("instance_id"), whole=whole_ids),
                "priority": str(t.get("priority") or "-"),
                "finished": _when(t.get("finished_at"), now, exact=exact)
                if t.get("finished_at")
                else "-",
            }
        )
    return rows


DAG_RUN_COLUMNS = (
    Column("run", "RUN"),
    Column("name", "DAG", priority=1),
    Column("status", "STATUS"),
    Column("nodes", "NODES", priority=3, shrink=True),
    Column("created", "CREATED", priority=2),
    Column("caller", "CALLER", priority=4),
    Column("reason", "REASON", priority=5, shrink=True, min_width=16),
    Column("finished", "FINISHED", wide=True),
    Column("retries", "RETRIES", wide=True),
)


def dag_run_rows(
    runs: Sequence[Mapping[str, Any]], now: float, *, exact: bool
) -> list[dict[str, str]]:
    """Rows of ``GET /api/v1/dag-runs`` items (nodes counted by status)."""
    rows = []
    for r in runs:
        nodes = r.get("nodes") or {}
        rows.append(
            {
                "run": str(r["run_id"]),
                "name": str(r.get("name") or "-"),
                "status": str(r["status"]),
                "nodes": ",".join(f"{k}:{v}" for k, v in sorted(nodes.items())) or "-",
                "created": _when(r.get("created_at"), now, exact=exact),
                "caller": str(r.get("caller") or "-"),
                "reason": " ".join(str(r.get("reason") or "").split()) or "-",
                "finished": _when(r.get("finished_at"), now, exact=exact)
                if r.get("finished_at")
                else "-",
                "retries": str(r.get("retries", 0)),
            }
        )
    return rows


ALERT_COLUMNS = (
    Column("at", "AT"),
    Column("kind", "KIND"),
    Column("agent", "AGENT", priority=2),
    Column("instance", "INSTANCE", priority=3),
    Column("summary", "SUMMARY", priority=1, shrink=True, min_width=24),
    Column("details", "DETAILS", wide=True),
)


def alert_rows(
    alerts: Sequence[Mapping[str, Any]], now: float, *, exact: bool, whole_ids: bool
) -> list[dict[str, str]]:
    """Rows of ``GET /api/v1/alerts`` items."""
    return [
        {
            "at": _when(a.get("at"), now, exact=exact),
            "kind": str(a["kind"]),
            "agent": str(a.get("agent_id") or "-"),
            "instance": _short(a.get("instance_id"), whole=whole_ids),
            "summary": " ".join(str(a.get("summary") or "").split()),
            "details": json.dumps(a.get("details") or {}, sort_keys=True, default=str),
        }
        for a in alerts
    ]
