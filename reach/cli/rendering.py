"""How the command line draws the fleet: rich tables and cells, with no I/O of their own.

The commands fetch from the hub and print; these builders only turn the hub's JSON into
`rich` renderables, so one status colour scheme serves every command.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

__all__ = [
    "APPROVAL_STYLE",
    "NODE_STYLE",
    "OUTCOME_STYLE",
    "STATUS_STYLE",
    "agents_table",
    "allow_list_lines",
    "approval_lines",
    "approval_state_line",
    "approvals_table",
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
        + (f"  priority={task['priority']}" if task.get("priority") else "")
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


# Approval status -> rich style.
APPROVAL_STYLE = {
    "pending": "yellow",
    "approved": "green",
    "rejected": "red",
    "expired": "bright_black",
    "cancelled": "bright_black",
}


def _when(ts: float | None) -> str:
    """A timestamp as UTC wall-clock time (what a human compares with a clock)."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _decider(approval: dict[str, Any]) -> str:
    """The identity that decided, with the display name it gave: ``key:abc (alice)``."""
    by, name = approval.get("decided_by"), approval.get("decided_name")
    if not by:
        return "-"
    return f"{by} ({name})" if name and name != by else str(by)


def _approval_status(approval: dict[str, Any]) -> str:
    status = str(approval["status"])
    style = APPROVAL_STYLE.get(status, "white")
    return f"[{style}]{status}[/{style}]"


def approvals_table(approvals: list[dict[str, Any]]) -> Table:
    """Approvals, one row each; the reason of a rejection is left to ``approvals show``."""
    table = Table(title="approvals")
    for column in (
        "approval",
        "task",
        "capability",
        "agent",
        "caller",
        "requested",
        "expires",
        "status",
        "decided by",
    ):
        table.add_column(column)
    for a in approvals:
        table.add_row(
            a["approval_id"],
            a["task_id"],
            escape(a["capability"]),
            a.get("agent_id") or "-",
            escape(a.get("caller") or "-"),
            _when(a["requested_at"]),
            _when(a["expires_at"]),
            _approval_status(a),
            escape(_decider(a)),
        )
    return table


def approval_lines(approval: dict[str, Any]) -> list[str]:
    """One approval, a field a line: what was asked, bound to which payload, and the
    decision (who, when, why) once there is one."""
    lines = [
        f"[bold]approval {approval['approval_id']}[/bold]  {_approval_status(approval)}",
        f"task:           {approval['task_id']}",
        f"capability:     {escape(approval['capability'])}",
        f"method:         {escape(approval.get('method') or '-')}",
        f"agent:          {approval.get('agent_id') or '-'}",
        f"caller:         {escape(approval.get('caller') or '-')}",
        f"payload sha256: {approval.get('payload_hash') or '-'}",
        f"requested:      {_when(approval['requested_at'])}",
        f"expires:        {_when(approval['expires_at'])}",
    ]
    if approval.get("decided_by") or approval.get("decided_at") is not None:
        lines.append(f"decided by:     {escape(_decider(approval))}")
        lines.append(f"decided at:     {_when(approval.get('decided_at'))}")
    if approval.get("reason"):
        lines.append(f"reason:         {escape(str(approval['reason']))}")
    return lines


# A task event of the approval gate -> the approval status it leaves behind.
APPROVAL_EVENTS = {
    "approval_requested": "pending",
    "approval_granted": "approved",
    "approval_rejected": "rejected",
    "approval_expired": "expired",
}


def approval_state_line(events: list[dict[str, Any]]) -> str | None:
    """Where a task stands at the approval gate, read from its events (the latest approval
    event decides, and any key that reads the task reads them); None if never parked."""
    found = [e for e in events if e["kind"] in APPROVAL_EVENTS]
    if not found:
        return None
    last = found[-1]
    detail: dict[str, Any] = {}
    for e in found:
        detail.update(e.get("detail") or {})
    view = {**detail, "status": APPROVAL_EVENTS[last["kind"]]}
    head = f"approval {escape(str(view.get('approval_id') or '?'))}  {_approval_status(view)}"
    if view["status"] == "pending":
        return (
            f"{head}  expires {_when(view.get('expires_at'))}  "
            f"(decide with `reach approvals approve|reject {view.get('approval_id')}`)"
        )
    if view["status"] == "expired":
        return f"{head}  at {_when(view.get('expires_at'))}: nobody decided in time"
    line = f"{head}  by {escape(_decider(view))} at {_when(last['at'])}"
    if view["status"] == "rejected" and view.get("reason"):
        line += f": {escape(str(view['reason']))}"
    return line
