"""Writing a run down: ``latest.json`` (the contract), a Markdown table and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench import semantic as bench_semantic
from bench.stats import P99_LIMIT_MS

SCENARIOS = ("single_hop", "channel_single_hop", "two_hop", "broadcast5", "inflight2000", "fault")
COLUMNS = ("rate", "p50_ms", "p95_ms", "p99_ms", "errors", "lost", "peak_rss_mb")
SPREAD = ("rate", "p50_ms", "p99_ms")  # shown with their range over the runs
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
SEED_INFLIGHT_P99_MS = 920.0  # seed 004's 2,000 tasks in flight to a 1 s agent, after tuning


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """Write ``latest.json``, a dated copy, ``latest.md`` and the plots; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = result["meta"]["started"].replace(":", "").replace("-", "")[:15]
    kind = result["meta"].get("level") or ("quick" if result["meta"]["quick"] else "full")
    dated = out / f"{stamp}-{kind}.json"
    dated.write_text(_json(result))
    latest = write_latest(result, out)
    return [latest[0], dated, latest[1], *plot(result, out)]


def write_latest(result: dict[str, Any], out: Path) -> list[Path]:
    """``latest.json`` and ``latest.md`` alone (a run judged again keeps its dated copy)."""
    paths = [out / "latest.json", out / "latest.md"]
    paths[0].write_text(_json(result))
    paths[1].write_text(markdown(result))
    return paths


def _json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2, sort_keys=False) + "\n"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _limit(value: float | None) -> str:
    """A target's limit as the issue states it (1.25 stays 1.25, 300.0 reads 300); one
    that could not be known (None: the in-flight wall without a measured throughput) "-"."""
    if not isinstance(value, int | float) or math.isnan(value):
        return _fmt(value)
    return f"{value:,g}"


def _spread(row: dict[str, Any], col: str) -> str:
    """``value`` and, for a repeated scenario, its range over the runs: ``6.5 (6.1-7.0)``."""
    value = _fmt(row.get(col))
    lo, hi = ((row.get("spread") or {}).get(col) or [None, None])[:2]
    if lo is None or hi is None or row.get("runs", 1) < 2:
        return value
    return f"{value} ({_fmt(lo)}-{_fmt(hi)})"


def _calibration(meta: dict[str, Any]) -> list[str]:
    """The machine's speed (``bench.calibrate``), when the run recorded it."""
    cal = meta.get("calibration")
    if not cal:
        return []
    load = ", ".join(_fmt(x) for x in cal.get("loadavg") or [])
    return [
        "",
        f"Machine calibration: `{cal['workload']}` took {_fmt(cal['calibration_ms'])} ms of "
        f"CPU (load average {load} at the start). CPU figures scale with it: to compare "
        "with another run, divide by the ratio of the two calibrations.",
    ]


def _hot_path(meta: dict[str, Any]) -> list[str]:
    """The hub's own path on this box (``bench.micro``), when the run recorded it."""
    hot = meta.get("hot_path")
    if not hot:
        return []
    cpu = ", ".join(f"{name} {_fmt(ms)}" for name, ms in hot["cpu_ms"].items())
    pg = ", ".join(f"{name} {_fmt(ms)}" for name, ms in hot["postgres_cpu_ms"].items())
    return [
        "",
        f"Hot path before any hub started (`{hot['command']}`: one thread's CPU per "
        f"operation, median, ms): {cpu}; PostgreSQL's CPU per {pg} (mean). The calibration "
        "above once read as usual while these were 1.3 to 2.3 times their usual values "
        "(docs/benchmarks.md).",
    ]


def _postgres(meta: dict[str, Any]) -> list[str]:
    """The PostgreSQL the run measured, and a warning when it never vacuums."""
    pg = meta.get("postgres")
    if not pg:
        return []
    line = (
        f"PostgreSQL {pg['server_version']}: autovacuum {pg['autovacuum']}, track_counts "
        f"{pg['track_counts']}, shared_buffers {pg['shared_buffers']}."
    )
    if pg["autovacuum"] != "on" or pg["track_counts"] != "on":
        line += (
            " **Nothing vacuums during this run**: every dead task version a hub leaves "
            "stays, and PostgreSQL's CPU and blocks per message grow with the tasks that "
            "hub has written (after the same 30,000 tasks: 422.3 blocks touched per "
            "message with autovacuum off, 178.8 with it on; docs/benchmarks.md)."
        )
    return ["", line]


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"Command: `{meta['command']}` — {meta['started']} — {meta['machine']}"]
    if meta.get("rescored"):
        again = meta["rescored"]
        lines += [
            "",
            f"Targets judged again {again['at']} by the rules of the code then "
            f"(`{again['command']}`): the measurements are this run's, unchanged.",
        ]
    lines += _calibration(meta)
    lines += _hot_path(meta)
    lines += _postgres(meta)
    runs = max((r.get("runs", 1) for r in result["scenarios"].values()), default=1)
    if result["scenarios"]:  # a run of flow-control parts alone has no main table
        lines += [
            "",
            f"Each scenario ran {runs} time(s): the median, and (min-max) over the runs; "
            "errors and lost are the worst run's; generator lag is the load generator's own "
            "(due → sent), p99.",
            "",
            "| scenario | offered /s | rate /s | p50 ms | p95 ms | p99 ms | errors | lost "
            "| hub peak RSS MB | generator lag ms | the field |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for name in SCENARIOS:
        row = result["scenarios"].get(name)
        if row is None:
            continue
        cells = [_spread(row, c) if c in SPREAD else _fmt(row.get(c)) for c in COLUMNS]
        lines.append(
            f"| {name} | {_fmt(row.get('offered_rate'))} | "
            + " | ".join(cells)
            + f" | {_fmt(row.get('loadgen_lag_p99_ms'))} | {FIELD[name]} |"
        )
    lines += inflight_lines(result)
    fault = (result.get("details") or {}).get("fault")
    if fault and "successes" in fault:
        lines += [
            "",
            "Fault run (the median run by peak ÷ normal): what the callers got. A fast "
            "refusal (503 circuit-open) and a dead letter are answers, not successes.",
            "",
            "| successes | fast refusals | dead letters | no answer | success p50 ms "
            "| refusal p50 ms | dead letter p50 ms | agent's normal req/s | outage peak "
            "| peak ÷ normal |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {fault['successes']} | {fault['fast_refusals']} | {fault['dead_letters']} "
            f"| {_fmt((result['scenarios'].get('fault') or {}).get('errors'))} "
            f"| {_fmt((result['scenarios'].get('fault') or {}).get('p50_ms'))} "
            f"| {_fmt(fault.get('refusal_p50_ms'))} | {_fmt(fault.get('dead_letter_p50_ms'))} "
            f"| {_fmt(fault['normal_rate'])} | {_fmt(fault['outage_peak_rate'])} "
            f"| {_fmt(fault['peak_to_normal'])} |",
        ]
    base = result.get("baselines") or {}
    if base:
        lines += [
            "",
            "Baselines (same client, same mock agent, same rate as single_hop; run with the "
            "hub stopped; plain Celery with the hub worker's pool and concurrency, then at "
            "other settings):",
            "",
        ]
        lines += [
            "| path | worker | rate /s | p50 ms | p95 ms | p99 ms | errors | max throughput /s |"
        ]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for name, row in base.items():
            ladder = row.get("ladder") or {}
            best = _fmt(row.get("max_throughput"))
            if ladder.get("spread") and row.get("runs", 1) > 1:
                best += f" ({_fmt(ladder['spread'][0])}-{_fmt(ladder['spread'][1])})"
            lines.append(
                f"| {name} | {row.get('worker', '-')} | {_fmt(row.get('rate'))} "
                f"| {_spread(row, 'p50_ms')} | {_fmt(row.get('p95_ms'))} "
                f"| {_spread(row, 'p99_ms')} | {_fmt(row.get('errors'))} | {best} |"
            )
    ratios = result.get("ratios") or {}
    if ratios:
        lines += ["", "Hub ÷ baseline: " + ", ".join(f"{k} {_fmt(v)}" for k, v in ratios.items())]
    if result.get("max_throughput") is not None:
        spread = (result.get("details") or {}).get("max_throughput_spread")
        shown = f" ({_fmt(spread[0])}-{_fmt(spread[1])} over the runs)" if spread else ""
        lines += [
            "",
            f"Max sustainable single-hop throughput: {_fmt(result['max_throughput'])} msg/s"
            f"{shown}; the ladder climbs until a step fails (errors, loss, p99 over "
            f"{_fmt(P99_LIMIT_MS)} ms or under 95 % of the offered rate).",
        ]
        for setting, row in ((result.get("details") or {}).get("hub_settings") or {}).items():
            lines.append(f"At worker {setting}: {_fmt(row['max_throughput'])} msg/s.")
    cost = result.get("cost")
    if cost:
        roles = cost["cpu_ms_per_msg"]
        lines += [
            "",
            f"CPU per message at {_fmt(cost['rate'])}/s ({cost['messages']} single hops), "
            "ms, by process:",
            "",
            "| " + " | ".join(roles) + " | hub total | all |",
            "|" + "---|" * (len(roles) + 2),
            "| "
            + " | ".join(_fmt(v) for v in roles.values())
            + f" | {_fmt(cost['hub_cpu_ms_per_msg'])} | {_fmt(cost['total_cpu_ms_per_msg'])} |",
        ]
        pg = cost.get("postgres_per_msg")
        if pg:
            lines += [
                "",
                "PostgreSQL per message: "
                + ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in pg.items()),
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
        lines += _token_cpu(tokens)
    lines += tracing_lines(result.get("tracing"))
    lines += slow_lines(result)
    lines += bench_semantic.lines(result)
    lines += flow_lines(result.get("flow") or {})
    lines += scale_lines(result)
    soak = result.get("soak")
    if soak:
        lines += [
            "",
            f"Soak ({_fmt(soak['duration_s'] / 60)} min at {_fmt(soak['rate'])}/s, the flaky "
            f"agent down {_fmt(soak['flap']['down_s'])} s of every "
            f"{_fmt(soak['flap']['period_s'])} s under {_fmt(soak['flap']['rate'])}/s; "
            f"{soak['lost']} lost; its callers got {soak['flaky_outcomes']}; the farthest "
            f"window from the first, up or down: p99 {_fmt(soak['p99_drift'])}x, RSS "
            f"{_fmt(soak['rss_drift'])}x):",
            "",
            "| from s | requests | errors | p50 ms | p99 ms | hub RSS MB |",
            "|---|---|---|---|---|---|",
            *(
                f"| {_fmt(w['from_s'])} | {w['requests']} | {w['errors']} | {_fmt(w['p50_ms'])} "
                f"| {_fmt(w['p99_ms'])} | {_fmt(w['rss_mb'])} |"
                for w in soak["windows"]
            ),
        ]
    so = result.get("scale_out")
    if so:
        row = so["single_hop"]
        lines += [
            "",
            f"Scale-out (a hub of its own: {so['api_replicas']} API replicas on one port, "
            f"`reach api --reuse-port`; {so['workers']} worker nodes, {so['worker']}): "
            f"max single hop {_fmt(so['max_throughput'])} msg/s; single hop "
            f"@{_fmt(row.get('offered_rate'))}/s p50 {_spread(row, 'p50_ms')} / p99 "
            f"{_spread(row, 'p99_ms')} ms; hub CPU per message "
            f"{_fmt(so['cost']['hub_cpu_ms_per_msg'])} ms.",
        ]
    targets = result.get("targets") or []
    if targets:
        lines += ["", "| target | value | limit | met |", "|---|---|---|---|"]
        for t in targets:
            sign = "≤" if t["at_most"] else "≥"
            lines.append(
                f"| {t['name']} | {_fmt(t['value'])} | {sign} {_limit(t['limit'])} "
                f"| {'yes' if t['met'] else '**no**'} |"
            )
    return "\n".join(lines) + "\n"


def _token_cpu(tokens: dict[str, Any]) -> list[str]:
    """CPU per message at the open loop's rate, on and off (runs before it have none)."""
    by_role = tokens.get("cpu_by_role_ms") or {}
    if tokens.get("cpu_on_ms") is None or not {"on", "off"} <= set(by_role):
        return []
    roles = ", ".join(
        f"{role} {_fmt(by_role['on'][role])} / {_fmt(by_role['off'].get(role))}"
        for role in by_role["on"]
    )
    return [
        "",
        f"CPU per message at {_fmt(tokens['rate'])}/s, all processes (on / off): "
        f"{_fmt(tokens['cpu_on_ms'])} / {_fmt(tokens['cpu_off_ms'])} ms; by process: {roles}.",
    ]


def inflight_lines(result: dict[str, Any]) -> list[str]:
    """The in-flight run's wall against its limit, and its p99 beside seed 004's."""
    row = result["scenarios"].get("inflight2000")
    detail = (result.get("details") or {}).get("inflight2000")
    if not row or not detail:
        return []
    agent = detail.get("agent", "2 agents that answer 202 and report 1 s later")
    return [
        "",
        f"In flight: {detail['tasks']:,} tasks at once to {agent}: wall "
        f"{_fmt(detail['wall_s'])} s (the median run's; limit 1 s + tasks ÷ max throughput: "
        f"{_fmt(detail['wall_limit_s'])} s); p99 {_fmt(row.get('p99_ms'))} ms (seed 004 "
        f"after tuning: {SEED_INFLIGHT_P99_MS:,.0f} ms); hub peak RSS "
        f"{_fmt(row.get('peak_rss_mb'))} MB.",
    ]


def tracing_lines(traced: dict[str, Any] | None) -> list[str]:
    """OpenTelemetry on against off (``bench.tracing``): the hub's CPU per message, each
    round and in all."""
    if not traced:
        return []
    by_role = traced["by_role_ms"]
    roles = [r for r in ("api", "worker", "beat", "postgres", "redis") if r in by_role["on"]]
    return [
        "",
        f"Tracing ({traced['rounds']} round(s) of on/off, fresh hub each, single hop at "
        f"{_fmt(traced['rate'])}/s; on: every span exported over OTLP/HTTP to a sink on "
        "loopback):",
        "",
        "| tracing | hub CPU ms/msg | " + " | ".join(roles) + " |",
        "|---|---|" + "---|" * len(roles),
        *(
            f"| {mode} | {_fmt(traced[f'hub_cpu_{mode}_ms'])} | "
            + " | ".join(_fmt(by_role[mode][r]) for r in roles)
            + " |"
            for mode in ("on", "off")
        ),
        "",
        f"Cost: {_fmt(traced['hub_cpu_cost_pct'])} % of the hub's CPU per message (each "
        "round, on against the off right after it: "
        + ", ".join(f"{_fmt(c)} %" for c in traced.get("paired_cost_pct") or [])
        + f"; median {_fmt(traced.get('paired_median_pct'))} %); spans exported with "
        f"tracing off: {traced['exports_off']}.",
    ]


def slow_lines(result: dict[str, Any]) -> list[str]:
    """Agents that think (``bench.slow``): a row per slow agent, a line for the broadcasts."""
    sa, fan = result.get("slow_agents"), result.get("broadcast50")
    if not sa and not fan:
        return []
    worker = (sa or fan or {}).get("worker", "prefork x2")
    lines = ["", f"Agents that think (a hub of its own, `reach worker` as shipped: {worker}):"]
    if sa:
        lines += [
            "",
            f"{sa['tasks']} tasks submitted at once (within {_fmt(sa['submitted_within_s'])} s) "
            f"to an agent whose handler takes {sa['handler_s']:g} s, each caller waiting for "
            "its result; wall: first submit to last result, the median (min-max) of the "
            "batches; latency: submit to result; accepted within: the first task's acceptance "
            "to the last one's, in the store (the API taking the batch in), median (max).",
            "",
            "| slow_agents | batches | wall s | p50 ms | p99 ms | accepted within s "
            "| caller errors | not success | hub peak RSS MB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sa["variants"].values():
            walls = row["walls_s"]
            wall = _fmt(row["wall_s"])
            if len(walls) > 1:
                wall += f" ({_fmt(min(walls))}-{_fmt(max(walls))})"
            accepted = _fmt(row.get("accepted_within_s"))
            if len(walls) > 1 and row.get("accepted_within_max_s") is not None:
                accepted += f" ({_fmt(row['accepted_within_max_s'])})"
            lines.append(
                f"| {row['agent']} | {len(walls)} | {wall} | {_spread(row, 'p50_ms')} "
                f"| {_spread(row, 'p99_ms')} | {accepted} | {_fmt(row['errors'])} "
                f"| {_fmt(row['not_success'])} | {_fmt(row['peak_rss_mb'])} |"
            )
    if fan:
        lines += [
            "",
            f"broadcast50: {fan['broadcasts']} broadcasts one after another (after one to "
            f"warm up, {_fmt(fan['warm_up']['duration_s'])} s) to {fan['instances']} "
            f"instances of an agent whose `def` handler takes {fan['handler_s']:g} s: "
            f"duration p50 {_fmt(fan['p50_s'])} s, p99 {_fmt(fan['p99_s'])} s, max "
            f"{_fmt(fan['max_s'])} s; every target succeeded: "
            f"{'yes' if fan['all_succeeded'] else 'no'} "
            f"({fan['targets_not_succeeded']} of {fan['instances'] * fan['broadcasts']} not).",
        ]
    return lines


def scale_lines(result: dict[str, Any]) -> list[str]:
    """Fleet and table scale (issue 17)."""
    lines: list[str] = []
    f = result.get("fleet")
    if f:
        lines += [
            "",
            f"Fleet scale (a hub of its own; idle instances heartbeating every 10 s, single "
            f"hops routed by capability at {_fmt(f['rate'])}/s):",
            "",
            "| idle instances | p50 ms | p99 ms | errors | registrations /s at this size "
            "| page of GET /api/v1/agents p50 / p99 ms |",
            "|---|---|---|---|---|---|",
        ]
        for size, step in sorted(f["sizes"].items(), key=lambda kv: int(kv[0])):
            r = step["routing"]
            lines.append(
                f"| {int(size):,} | {_fmt(r['p50_ms'])} | {_fmt(r['p99_ms'])} "
                f"| {_fmt(r['errors'])} | {_fmt(step['registrations_per_s_at_size'])} "
                f"| {_fmt(step['page']['p50_ms'])} / {_fmt(step['page']['p99_ms'])} |"
            )
        hb = f.get("heartbeat_cpu_ms") or {}
        idle = f.get("idle_fleet_cpu_per_s") or {}
        lines += [
            "",
            f"One heartbeat costs {_fmt(hb.get('api'))} ms of API CPU "
            f"({_fmt(f.get('heartbeats_per_s'))} heartbeats/s measured, "
            f"{f.get('heartbeat_errors', 0)} failed). The idle fleet's own cost, CPU seconds "
            "a second by process (heartbeats, and the hub probing every instance): "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in idle.items())
            + ".",
        ]
    t = result.get("table_scale")
    if t:
        lines += [
            "",
            f"Table scale: saturated single hop {_fmt(t['empty_rate'])} msg/s on an empty "
            f"store, {_fmt(t['full_rate'])} msg/s with {t['rows']:,} finished tasks "
            f"(medians of {len(t['runs']['empty'])} alternating runs; "
            f"{_throughput_change(t['loss_pct'])}).",
        ]
    return lines


def _throughput_change(loss_pct: float | None) -> str:
    """``loss_pct`` is the full store's throughput shortfall against the empty one's: a
    negative shortfall is a gain, said as such (not as "-5 % lost")."""
    if loss_pct is None:
        return "no rate on the empty store to compare with"
    if loss_pct >= 0:
        return f"{_fmt(loss_pct)} % less throughput with the rows"
    return f"{_fmt(-loss_pct)} % more throughput with the rows"


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
            f"{pr['background_backlog_at_end']}{_bg_lost(pr)} | {FIELD['priority']} |"
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


def _bg_lost(pr: dict[str, Any]) -> str:
    """The background throughput online work cost, when the run measured it."""
    lost = pr.get("background_throughput_lost")
    if lost is None:
        return ""
    return (
        f"; background {_fmt(pr['background_done_per_s_with_online'])}/s with online work, "
        f"{_fmt(pr['background_done_per_s_alone'])}/s alone ({lost * 100:.0f} % lost)"
    )
