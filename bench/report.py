"""Writing a run down: ``latest.json`` (the contract), a Markdown table and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SCENARIOS = ("single_hop", "channel_single_hop", "two_hop", "broadcast5", "inflight2000", "fault")
COLUMNS = ("rate", "p50_ms", "p95_ms", "p99_ms", "errors", "lost", "peak_rss_mb")
FIELD = {  # the field's published figures (three servers), for the table
    "single_hop": "500 QPS: p50 45 / p95 90 / p99 180 ms",
    "channel_single_hop": "(ours) an agent behind NAT, over its WebSocket channel",
    "two_hop": "200 QPS: p50 220 / p99 920 ms",
    "broadcast5": "50 QPS: p50 1,200 / p99 3,600 ms",
    "inflight2000": "1 s agent, after tuning: p99 920 ms",
    "fault": "failing agent saw 15x its rate (30 → 470 req/s)",
    "retry_storm": "40 s outage: 15x the rate at the order agent, 61 of 1,950 dead-lettered",
    "loop": "two agents reached each other until someone noticed",
    "priority": "online p99 6 s under background load (2 s after tuning)",
    "backpressure": "a fast agent flooded a slow one",
}


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """Write ``latest.json``, a dated copy, ``latest.md`` and the plots; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = result["meta"]["started"].replace(":", "").replace("-", "")[:15]
    kind = result["meta"].get("level") or ("quick" if result["meta"]["quick"] else "full")
    body = json.dumps(result, indent=2, sort_keys=False) + "\n"
    paths = [out / "latest.json", out / f"{stamp}-{kind}.json", out / "latest.md"]
    paths[0].write_text(body)
    paths[1].write_text(body)
    paths[2].write_text(markdown(result))
    paths += plot(result, out)
    return paths


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"Command: `{meta['command']}` — {meta['started']} — {meta['machine']}"]
    if result["scenarios"]:  # a run of flow-control parts alone has no main table
        lines += [
            "",
            "| scenario | offered /s | rate /s | p50 ms | p95 ms | p99 ms | errors | lost "
            "| hub peak RSS MB | the field |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    for name in SCENARIOS:
        row = result["scenarios"].get(name)
        if row is None:
            continue
        cells = [_fmt(row.get(c)) for c in COLUMNS]
        lines.append(
            f"| {name} | {_fmt(row.get('offered_rate'))} | "
            + " | ".join(cells)
            + f" | {FIELD[name]} |"
        )
    base = result.get("baselines") or {}
    if base:
        lines += ["", "Baselines (same client, same mock agent, same rate as single_hop):", ""]
        lines += ["| path | rate /s | p50 ms | p95 ms | p99 ms | errors | max throughput /s |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for name, row in base.items():
            lines.append(
                f"| {name} | {_fmt(row.get('rate'))} | {_fmt(row.get('p50_ms'))} "
                f"| {_fmt(row.get('p95_ms'))} | {_fmt(row.get('p99_ms'))} "
                f"| {_fmt(row.get('errors'))} | {_fmt(row.get('max_throughput'))} |"
            )
    ratios = result.get("ratios") or {}
    if ratios:
        lines += ["", "Hub ÷ baseline: " + ", ".join(f"{k} {_fmt(v)}" for k, v in ratios.items())]
    if result.get("max_throughput") is not None:
        lines += [
            "",
            f"Max sustainable single-hop throughput: {_fmt(result['max_throughput'])} msg/s",
        ]
    tokens = result.get("tokens")
    if tokens:
        lines += [
            "",
            f"Reach tokens ({tokens['rounds']} round(s) of on/off, fresh hub each; saturated: "
            f"{tokens['callers']} closed-loop callers; latency: open loop at "
            f"{_fmt(tokens['rate'])}/s):",
            "",
            "| reach tokens | saturated msg/s | p50 ms | p99 ms |",
            "|---|---|---|---|",
            f"| on (hub signs, agent verifies) | {_fmt(tokens['saturated_on'])} "
            f"| {_fmt(tokens['p50_on_ms'])} | {_fmt(tokens['p99_on_ms'])} |",
            f"| off | {_fmt(tokens['saturated_off'])} | {_fmt(tokens['p50_off_ms'])} "
            f"| {_fmt(tokens['p99_off_ms'])} |",
            "",
            "Each run's saturated rate (on / off): "
            + " / ".join(
                ", ".join(_fmt(r["saturated_rate"]) for r in tokens["runs"][mode])
                for mode in ("on", "off")
            ),
        ]
    lines += flow_lines(result.get("flow") or {})
    targets = result.get("targets") or []
    if targets:
        lines += ["", "| target | value | limit | met |", "|---|---|---|---|"]
        for t in targets:
            sign = "≤" if t["at_most"] else "≥"
            lines.append(
                f"| {t['name']} | {_fmt(t['value'])} | {sign} {_fmt(t['limit'])} "
                f"| {'yes' if t['met'] else '**no**'} |"
            )
    fault = (result.get("details") or {}).get("fault")
    if fault:
        lines += [
            "",
            f"Fault run: normal {_fmt(fault['normal_rate'])} req/s at the agent; during the "
            f"outage peak {_fmt(fault['outage_peak_rate'])}, "
            f"mean {_fmt(fault['outage_mean_rate'])} req/s; callers: {fault['outcomes']}",
        ]
    return "\n".join(lines) + "\n"


def flow_lines(f: dict[str, Any]) -> list[str]:
    """The flow-control rows (issue 14): one line of figures per scenario."""
    if not f:
        return []
    lines = [
        "",
        "Flow control (issue 14; each scenario on a hub of its own, one shared in --smoke):",
        "",
        "| scenario | what | measured | the field |",
        "|---|---|---|---|",
    ]
    s = f.get("retry_storm")
    if s:
        lines.append(
            f"| retry_storm | {s['callers']} callers, {_fmt(s['offered_rate'])} reaches/s, "
            f"each re-reaching up to {s['rereach']}x on failure; the order agent answers 503 "
            f"for {_fmt(s['phases_s'][1])} s "
            f"| at the agent: normal {_fmt(s['normal_rate'])}/s, outage mean "
            f"{_fmt(s['outage_mean_rate'])}/s ({_fmt(s['outage_to_normal'])}x), peak "
            f"{_fmt(s['outage_peak_rate'])}/s, after it peak "
            f"{_fmt(s.get('recovery_peak_rate'))}/s; "
            f"dead-lettered {s['dead_lettered']} "
            f"(breaker open: {s['dead_lettered_breaker']}); refusals p50/p99 "
            f"{_fmt(s['refusal_p50_ms'])}/{_fmt(s['refusal_p99_ms'])} ms; accepted reaches "
            f"p50/p99 {_fmt(s['accepted_p50_ms'])}/{_fmt(s['accepted_p99_ms'])} ms, last "
            f"{_fmt(s['answered_after_recovery_s'])} s after recovery; not ended "
            f"{s['not_ended']}; sends {s['send_outcomes']}; the hub's re-sends "
            f"{s.get('hub_retries_by_reason', {})} | {FIELD['retry_storm']} |"
        )
    lp = f.get("loop")
    if lp:
        lines.append(
            "| loop | A's and B's handlers reach each other; then "
            f"{lp['alert_roots']} separate roots each way (alert threshold "
            f"{lp['alert_threshold']}) "
            f"| tasks created {lp['tasks_created']}, stopped at the first repeat: "
            f"{'yes' if lp['stopped_at_first_repeat'] else 'no'} ({_fmt(lp['stop_s'])} s, "
            f"root: {lp['root_outcome']}); alert raised: "
            f"{'yes' if lp['alert_raised'] else 'no'} (metric {_fmt(lp['alert_metric'])}, "
            f"links {', '.join(lp['alert_links_suspected']) or '-'}) | {FIELD['loop']} |"
        )
    pr = f.get("priority")
    if pr:
        u, ld = pr["unloaded"], pr["loaded"]
        lines.append(
            f"| priority | online single hop at {_fmt(pr['online_rate'])}/s, unloaded and "
            f"under {_fmt(pr['background_rate'])}/s background to a "
            f"{pr['background_latency_s']:g} s agent "
            f"| p50/p99 unloaded {_fmt(u['p50_ms'])}/{_fmt(u['p99_ms'])} ms, flooded "
            f"{_fmt(ld['p50_ms'])}/{_fmt(ld['p99_ms'])} ms (p99 {_fmt(pr['p99_ratio'])}x); "
            f"background backlog {pr['background_backlog_at_start']} → "
            f"{pr['background_backlog_at_end']} | {FIELD['priority']} |"
        )
    bp = f.get("backpressure")
    if bp:
        lines.append(
            f"| backpressure | {_fmt(bp['offered_rate'])} submits/s for "
            f"{_fmt(bp['duration_s'])} s to a {bp['agent_latency_s']:g} s agent, "
            f"max_queue {bp['max_queue']} "
            f"| accepted {bp['accepted']} (completed {bp['accepted_completed']}), "
            f"backpressure {bp['refused_backpressure']} (retry_after_ms "
            f"{_fmt(bp['retry_after_ms_min'])} to {_fmt(bp['retry_after_ms_max'])}, unusable "
            f"{bp['refusals_unusable']}); hub RSS {_fmt(bp['idle_rss_mb'])} → "
            f"{_fmt(bp['peak_rss_mb'])} MB | {FIELD['backpressure']} |"
        )
    return lines


def plot(result: dict[str, Any], out: Path) -> list[Path]:
    """Latency percentiles per scenario, and the fault run's timeline at the agent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names = [n for n in SCENARIOS if n in result["scenarios"]]
    rows = [result["scenarios"][n] for n in names]
    base = result.get("baselines") or {}
    names += [f"baseline: {n}" for n in base]
    rows += list(base.values())
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.27
    for k, col in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        values = [r.get(col) or 0 for r in rows]
        ax.bar([i + (k - 1) * width for i in range(len(rows))], values, width, label=col)
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("end-to-end latency, ms (log)")
    ax.set_title("Agent-Reach on 2 cores: latency percentiles per scenario")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fault = (result.get("details") or {}).get("fault")
    if fault:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        series = fault["timeline_per_s"]
        ax.plot(range(len(series)), series, drawstyle="steps-post", label="requests at the agent")
        ax.axvspan(
            fault["outage_from_s"],
            fault["outage_to_s"],
            alpha=0.15,
            color="red",
            label="agent down (503)",
        )
        ax.axhline(2 * fault["normal_rate"], linestyle="--", color="grey", label="2x normal")
        ax.set_xlabel("seconds")
        ax.set_ylabel("req/s")
        ax.set_title("Fault run: request rate reaching the failing agent")
        ax.legend(loc="upper right")
        fig.tight_layout()
        paths.append(out / "fault.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    storm = (result.get("flow") or {}).get("retry_storm")
    if storm:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        series = storm["timeline_per_s"]
        ax.plot(range(len(series)), series, drawstyle="steps-post", label="requests at the agent")
        ax.axvspan(
            storm["outage_from_s"], storm["outage_to_s"], alpha=0.15, color="red",
            label="agent answers 503",
        )  # fmt: skip
        ax.axhline(1.2 * storm["normal_rate"], linestyle="--", color="grey", label="1.2x normal")
        ax.set_xlabel("seconds")
        ax.set_ylabel("req/s")
        ax.set_title(f"Retry storm: {storm['callers']} re-reaching callers, one failing agent")
        ax.legend(loc="upper right")
        fig.tight_layout()
        paths.append(out / "retry_storm.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
