"""How the command line draws the fleet: rich tables and cells, with no I/O of their own.

The commands fetch from the hub and print; these builders only turn the hub's JSON into
`rich` renderables, so one status colour scheme serves every command.
"""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

__all__ = [
    "NODE_STYLE",
    "OUTCOME_STYLE",
    "STATUS_STYLE",
    "agents_table",
    "allow_list_lines",
    "audit_tables",
    "dag_table",
    "dead_letters_table",
    "events_table",
    "score_cell",
    "task_lines",
]

# Instance status -> rich style.
STATUS_STYLE = {
    "online": "green",
    "degraded": "yellow",
    "unreachable": "red",
    "offline": "bright_black",
    "deregistered": "bright_black",
}

# DAG node status -> rich style.
NODE_STYLE = {
    "success": "green",
    "failed": "red",
    "timeout": "red",
    "skipped": "bright_black",
    "running": "yellow",
    "pending": "white",
}


def agents_table(agents: list[dict[str, Any]]) -> Table:
    """One row per instance (one ``offline`` row for an agent with none)."""
    table = Table(title="Agents", show_lines=False)
    for column in (
        "agent",
        "instance",
        "status",
        "score",
        "endpoint",
        "last heartbeat",
        "load",
        "in flight",
        "tags",
        "capabilities",
    ):
        table.add_column(column)
    for agent in agents:
        caps = ", ".join(c["type"] for c in agent["capabilities"])
        tags = ", ".join(agent["tags"])
        if not agent["instances"]:
            table.add_row(agent["agent_id"], "-", "offline", "-", "-", "-", "-", "-", tags, caps)
        for inst in agent["instances"]:
            style = STATUS_STYLE.get(inst["status"], "white")
            table.add_row(
                agent["agent_id"],
                inst["instance_id"][:12],
                f"[{style}]{inst['status']}[/{style}]",
                score_cell(inst.get("reach_score")),
                inst.get("public_endpoint") or inst["endpoint"],
                f"{inst['heartbeat_age_s']:.1f}s ago",
                f"{inst['current_load']:.0%}",
                f"{inst['in_flight']}/{inst['max_concurrency']}",
                tags,
                caps,
            )
    return table


def score_cell(score: float | None) -> str:
    """A ReachScore, green from 80, yellow from 60 (where probing speeds up), red below."""
    if score is None:
        return "-"
    colour = "green" if score >= 80 else "yellow" if score >= 60 else "red"
    return f"[{colour}]{score:.1f}[/{colour}]"


def task_lines(task: dict[str, Any]) -> list[str]:
    """A task's summary line, then its result and error when it has them."""
    lines = [
        f"[bold]{task['task_id']}[/bold]  {task['status']}  method={task['method']}  "
        f"agent={task['agent_id']}  attempt={task['attempt_seq']}  "
        f"retries={task['retries']}"
    ]
    if task.get("result") is not None:
        lines.append(f"result: {json.dumps(task['result'])}")
    if task.get("error"):
        lines.append(f"error: {json.dumps(task['error'])}")
    return lines


def events_table(events: list[dict[str, Any]]) -> Table:
    """A task's audit trail, oldest first as the hub returns it."""
    table = Table(title="events")
    for column in ("at", "kind", "attempt", "agent", "instance", "detail"):
        table.add_column(column)
    for e in events:
        table.add_row(
            f"{e['at']:.3f}",
            e["kind"],
            str(e["attempt_seq"]),
            e["agent_id"] or "-",
            (e["instance_id"] or "-")[:12],
            json.dumps(e["detail"])[:120],
        )
    return table


def dead_letters_table(rows: list[dict[str, Any]]) -> Table:
    """Dead-lettered tasks, a replayed one marked ``yes``."""
    table = Table(title="dead letters")
    for column in ("id", "task", "agent", "method", "attempts", "reason", "replayed"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["task_id"],
            r["agent_id"] or "-",
            r["method"],
            str(r["attempts"]),
            r["reason"],
            "yes" if r["replayed_at"] else "",
        )
    return table


def dag_table(run: dict[str, Any]) -> Table:
    """A DAG run's nodes with their status, task and reason; the run's reason as caption."""
    table = Table(
        title=f"{run['name']}  {run['run_id']}  [bold]{run['status']}[/bold]",
        caption=run.get("reason") or None,
    )
    for column in ("node", "status", "task", "reason"):
        table.add_column(column)
    for node in run["nodes"]:
        style = NODE_STYLE.get(node["status"], "white")
        table.add_row(
            node["node_id"],
            f"[{style}]{node['status']}[/{style}]",
            node["task_id"] or "-",
            (node["reason"] or "")[:80],
        )
    return table


def allow_list_lines(view: dict[str, Any]) -> list[str]:
    """An agent's trust level and allow-list, one line each."""
    changed = view.get("changed")
    lines = [
        f"[bold]{view['agent_id']}[/bold]  trust={view['trust_level']}"
        + ("" if changed is None else ("  (changed)" if changed else "  (unchanged)"))
    ]
    lines.append("may call:       " + (", ".join(view["call"]) or "-"))
    lines.append("callable by:    " + (", ".join(view["callable_by"]) or "-"))
    return lines


# Audit outcome -> rich style.
OUTCOME_STYLE = {
    "success": "green",
    "allowed": "green",
    "refused": "red",
    "dead": "red",
    "failed": "red",
    "retry": "yellow",
}


def audit_tables(trail: dict[str, Any]) -> list[Table]:
    """A task's audit trail: its events with the identity behind each, then the audit-log
    rows naming it (L3 reaches, refusals)."""
    events = Table(
        title=f"audit of {trail['task_id']}  [bold]{trail['status']}[/bold]",
        caption="identities: " + (", ".join(trail["identities"]) or "-"),
    )
    for column in ("at", "actor", "kind", "outcome", "agent", "instance", "attempt"):
        events.add_column(column)
    for e in trail["events"]:
        style = OUTCOME_STYLE.get(e["outcome"], "white")
        events.add_row(
            f"{e['at']:.3f}",
            e["actor"],
            e["kind"],
            f"[{style}]{e['outcome']}[/{style}]",
            e["agent_id"] or "-",
            (e["instance_id"] or "-")[:12],
            str(e["attempt_seq"]),
        )
    log = Table(title="audit log")
    for column in ("at", "actor", "action", "target", "outcome", "detail"):
        log.add_column(column)
    for a in trail["audit"]:
        style = OUTCOME_STYLE.get(a["outcome"], "white")
        log.add_row(
            f"{a['at']:.3f}",
            a["actor"],
            a["action"],
            a["target"] or "-",
            f"[{style}]{a['outcome']}[/{style}]",
            json.dumps(a["detail"])[:120],
        )
    return [events, log] if trail["audit"] else [events]
