"""``python -m bench`` / ``reach bench``: run the table and write it down."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import channel as bench_channel
from bench import flow, report, scenarios
from bench.processes import REPO, Hub, flush_redis, spawn
from bench.stats import Summary, Target, ratio

ALL = (
    "single_hop",
    "channel_single_hop",
    "baselines",
    "max_throughput",
    "two_hop",
    "broadcast5",
    "inflight2000",
    "fault",
    "tokens",
    *flow.FLOW,  # retry_storm, loop, priority, backpressure: each on a hub of its own
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a check in under 2 minutes")
    p.add_argument("--smoke", action="store_true", help="the smallest run of every scenario")
    p.add_argument("--only", nargs="*", choices=ALL, help="run only these parts")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--worker-pool", default="prefork", choices=("threads", "prefork"))
    p.add_argument("--worker-concurrency", type=int, default=None)
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    result = run(args)
    paths = report.write(result, args.out)
    print(report.markdown(result))
    print(
        "written: "
        + ", ".join(
            str(p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p) for p in paths
        )
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    level = "smoke" if args.smoke else "quick" if args.quick else "full"
    plan = scenarios.Plan(level=level)
    parts = set(args.only or ALL)
    home = Path(tempfile.mkdtemp(prefix="reach-bench-"))
    concurrency = args.worker_concurrency or (16 if args.worker_pool == "threads" else 4)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    hub = Hub(
        home, worker_concurrency=concurrency, pool=args.worker_pool, extra_env=plan.hub_settings
    )
    result: dict[str, Any] = {
        "meta": {
            "command": "python -m bench" + ("" if level == "full" else f" --{level}"),
            "started": started,
            "quick": level != "full",
            "level": level,
            "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, everything on one box",
            "worker": f"{args.worker_pool} x{concurrency}",
        },
        "scenarios": {},
        "baselines": {},
        "max_throughput": None,
        "details": {},
    }
    log = _progress(t0)
    try:
        if parts - {"tokens", *flow.FLOW}:  # the main hub (those parts start hubs of their own)
            bench = scenarios.Bench(hub, home, plan)
            try:
                hub.start()
                out = result["scenarios"]
                if "single_hop" in parts:
                    out["single_hop"] = scenarios.hub_single(
                        bench, plan.single_rate, plan.duration
                    ).as_dict()
                    log("single_hop", out["single_hop"])
                if "channel_single_hop" in parts:  # the same load, to an agent behind NAT
                    out["channel_single_hop"] = bench_channel.channel_single_hop(
                        bench, plan.single_rate, plan.duration
                    ).as_dict()
                    log("channel_single_hop", out["channel_single_hop"])
                if "max_throughput" in parts:
                    best, steps = scenarios.max_throughput(
                        lambda r, d: scenarios.hub_single(bench, r, d, name="max"),
                        plan.max_rates,
                        plan.step_duration,
                    )
                    result["max_throughput"] = round(best, 1)
                    result["details"]["max_throughput_steps"] = steps
                    log("max_throughput", {"rate": best})
                if "baselines" in parts:
                    result["baselines"] = _baselines(bench, plan, home, log)
                if "two_hop" in parts:
                    out["two_hop"] = scenarios.two_hop(bench).as_dict()
                    log("two_hop", out["two_hop"])
                if "broadcast5" in parts:
                    out["broadcast5"] = scenarios.broadcast5(bench).as_dict()
                    log("broadcast5", out["broadcast5"])
                if "inflight2000" in parts:
                    summary, detail = scenarios.inflight(bench, result["max_throughput"] or 0.0)
                    out["inflight2000"] = summary.as_dict()
                    result["details"]["inflight2000"] = detail
                    log("inflight2000", {**out["inflight2000"], **detail})
                if "fault" in parts:
                    summary, detail = scenarios.fault(bench)
                    out["fault"] = summary.as_dict()
                    result["details"]["fault"] = detail
                    log("fault", {**out["fault"], "outcomes": detail["outcomes"]})
            finally:
                bench.stop_agents()  # a failed run must not leave agent processes behind
                hub.stop()
        wanted = [n for n in flow.FLOW if n in parts]  # after the main hub stopped
        if wanted:
            result["flow"] = _flow(wanted, plan, home, concurrency, args.worker_pool, log)
        if "tokens" in parts:  # after the main hub stopped: the machine is its own
            result["tokens"] = _tokens(plan, home, concurrency, args.worker_pool, log)
    finally:
        if not args.keep_logs:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"logs kept in {home}", file=sys.stderr)
    result["ratios"] = _ratios(result)
    result["targets"] = [t.as_dict() for t in targets(result)]
    result["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _baselines(
    bench: scenarios.Bench, plan: scenarios.Plan, home: Path, log: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    direct = scenarios.direct_single(bench, plan.single_rate, plan.duration).as_dict()
    best, _ = scenarios.max_throughput(
        lambda r, d: scenarios.direct_single(bench, r, d), plan.max_rates, plan.step_duration
    )
    out["direct_http"] = {**direct, "max_throughput": round(best, 1)}
    log("baseline direct_http", out["direct_http"])
    url = os.environ.get("BENCH_CELERY_URL", "redis://127.0.0.1:6379/11")
    flush_redis(url)
    worker = spawn(
        "plain-celery",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.plain_celery",
            "worker",
            "-c",
            "2",
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ],
        {**os.environ, "BENCH_CELERY_URL": url},
        home,
    )
    try:
        _wait_for_plain_worker()
        celery = scenarios.celery_single(bench, plan.single_rate, plan.duration).as_dict()
        best, _ = scenarios.max_throughput(
            lambda r, d: scenarios.celery_single(bench, r, d), plan.max_rates, plan.step_duration
        )
        out["plain_celery"] = {**celery, "max_throughput": round(best, 1)}
        log("baseline plain_celery", out["plain_celery"])
    finally:
        worker.stop()
    return out


def _wait_for_plain_worker(timeout: float = 30.0) -> None:
    """Until the baseline's Celery worker answers a ping (it starts in a few seconds)."""
    from bench.plain_celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.control.ping(timeout=0.5):
            return
    raise RuntimeError("the plain Celery worker did not start")


def _tokens(
    plan: scenarios.Plan, home: Path, concurrency: int, pool: str, log: Any
) -> dict[str, Any]:
    """What reach tokens cost: the same single hop with the hub signing every delivery and
    the agent verifying it ("on", the default), and with both off. Each configuration gets
    a fresh hub; they alternate (on, off, on, off ...) so drift of the machine spreads
    evenly. Reported: the saturated (closed-loop) completed rate and the open-loop p50 and
    p99 at a rate both sustain."""
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for round_no in range(plan.token_rounds):
        for mode in ("on", "off"):
            env = {
                **plan.hub_settings,
                "REACH_SECURITY__SIGN_DELIVERIES": "true" if mode == "on" else "false",
            }
            where = home / f"tokens-{mode}-{round_no}"
            where.mkdir(parents=True, exist_ok=True)
            hub = Hub(where, worker_concurrency=concurrency, pool=pool, extra_env=env)
            bench = scenarios.Bench(hub, where, plan)
            try:
                hub.start()
                bench.agent("echo", verify_tokens=mode == "on")
                closed = scenarios.closed_loop(bench, plan.token_callers, plan.duration)
                fixed = scenarios.hub_single(bench, plan.token_rate, plan.duration, name="tok")
            finally:
                bench.stop_agents()  # a failed run must not leave agent processes behind
                hub.stop()
            row = {
                "saturated_rate": closed.rate,
                "saturated_errors": closed.errors,
                "p50_ms": fixed.p50_ms,
                "p99_ms": fixed.p99_ms,
                "errors": fixed.errors,
                "lost": closed.lost + fixed.lost,
            }
            runs[mode].append(row)
            log(f"tokens {mode} #{round_no + 1}", {**row, "rate": closed.rate})

    def mean(mode: str, key: str) -> float:
        values = [float(r[key]) for r in runs[mode] if r[key] is not None]
        return sum(values) / len(values) if values else float("nan")

    on, off = mean("on", "saturated_rate"), mean("off", "saturated_rate")
    return {
        "rounds": plan.token_rounds,
        "callers": plan.token_callers,
        "rate": plan.token_rate,
        "runs": runs,
        "saturated_on": _r(on),
        "saturated_off": _r(off),
        "throughput_cost_pct": _r(100 * (1 - ratio(on, off))),
        "p50_on_ms": _r(mean("on", "p50_ms")),
        "p50_off_ms": _r(mean("off", "p50_ms")),
        "p99_on_ms": _r(mean("on", "p99_ms")),
        "p99_off_ms": _r(mean("off", "p99_ms")),
    }


def _flow(
    names: list[str], plan: scenarios.Plan, home: Path, concurrency: int, pool: str, log: Any
) -> dict[str, Any]:
    """The flow-control scenarios, each on a fresh hub with its settings (``Plan.flow_env``);
    the smoke run shares one hub with all their settings (``Plan.flow_shared_hub``): a
    hub's start and stop cost more than a smoke-sized scenario."""
    out: dict[str, Any] = {}

    def one(name: str, bench: scenarios.Bench, env: dict[str, str]) -> None:
        if name == "retry_storm":
            row = flow.retry_storm(bench)
        elif name == "loop":
            row = flow.loop(bench)
        elif name == "priority":
            row = flow.priority(bench, concurrency)
        else:
            row = flow.backpressure(bench)
        out[name] = {"hub_settings": env, **row}
        log(name, out[name])

    if plan.flow_shared_hub:
        env = {k: v for name in names for k, v in plan.flow_env(name).items()}
        with flow.fresh_bench(plan, home, "flow", env, concurrency, pool) as bench:
            for name in names:
                one(name, bench, env)
        return out
    for name in names:
        env = plan.flow_env(name)
        with flow.fresh_bench(plan, home, name, env, concurrency, pool) as bench:
            one(name, bench, env)
    return out


def _ratios(result: dict[str, Any]) -> dict[str, Any]:
    hub = result["scenarios"].get("single_hop") or {}
    base = result.get("baselines") or {}
    out: dict[str, Any] = {}
    for name, row in base.items():
        out[f"p50 vs {name}"] = _r(ratio(hub.get("p50_ms") or 0, row.get("p50_ms") or 0))
        out[f"p99 vs {name}"] = _r(ratio(hub.get("p99_ms") or 0, row.get("p99_ms") or 0))
        out[f"max throughput vs {name}"] = _r(
            ratio(result.get("max_throughput") or 0, row.get("max_throughput") or 0)
        )
    return out


def _ratio(a: object, b: object) -> float:
    """a / b as a float, NaN when either is missing or b is zero."""
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return float("nan")
    return round(float(a) / float(b), 2)


def _r(value: float) -> float | None:
    return None if value != value else round(value, 2)


def targets(result: dict[str, Any]) -> list[Target]:
    """The issue's targets for this machine, checked against what was measured."""
    s = result["scenarios"]
    nan = float("nan")

    def get(name: str, col: str) -> float:
        value = (s.get(name) or {}).get(col)
        return nan if value is None else float(value)

    out = []
    if result.get("max_throughput") is not None:
        out.append(Target("max single-hop throughput, msg/s", result["max_throughput"], 200, False))
    if "single_hop" in s:
        out += [
            Target("single hop @100/s p50 ms", get("single_hop", "p50_ms"), 15),
            Target("single hop @100/s p99 ms", get("single_hop", "p99_ms"), 50),
        ]
    if "channel_single_hop" in s and "single_hop" in s:
        http, chan = s["single_hop"], s["channel_single_hop"]
        out += [
            Target(
                "channel single hop p50 ÷ HTTP single hop p50",
                _ratio(chan.get("p50_ms"), http.get("p50_ms")),
                1.2,
            ),
            Target(
                "channel single hop rate ÷ HTTP single hop rate",
                _ratio(chan.get("rate"), http.get("rate")),
                1 / 1.2,
                False,
            ),
        ]
    if "two_hop" in s:
        out.append(Target("two hops @50/s p99 ms", get("two_hop", "p99_ms"), 100))
    if "broadcast5" in s:
        out += [
            Target("broadcast to 5 @20/s p50 ms", get("broadcast5", "p50_ms"), 60),
            Target("broadcast to 5 @20/s p99 ms", get("broadcast5", "p99_ms"), 150),
        ]
    detail = result["details"].get("inflight2000")
    if detail:
        out += [
            Target("in-flight run wall time s", detail["wall_s"], detail["wall_limit_s"]),
            Target("in-flight run lost tasks", get("inflight2000", "lost"), 0),
            Target("in-flight run hub peak RSS MB", get("inflight2000", "peak_rss_mb"), 1024),
        ]
    fault = result["details"].get("fault")
    if fault:
        out += [
            Target("fault: peak rate at failing agent ÷ normal", fault["peak_to_normal"] or nan, 2),
            Target(
                "fault: callers left hanging",
                fault["outcomes"].get("gave_up", 0) + fault["outcomes"].get("error", 0),
                0,
            ),
            Target("fault run lost tasks", get("fault", "lost"), 0),
        ]
    for name in s:
        if name not in ("inflight2000", "fault"):
            out.append(Target(f"{name} lost tasks", get(name, "lost"), 0))
    tokens = result.get("tokens")
    if tokens:
        cost = tokens["throughput_cost_pct"]
        out.append(
            Target(
                "reach tokens: saturated throughput lost to signing + verifying, %",
                nan if cost is None else cost,
                10,
            )
        )
        lost = sum(r["lost"] for runs in tokens["runs"].values() for r in runs)
        out.append(Target("tokens runs lost tasks", lost, 0))
    return out + flow_targets(result.get("flow") or {})


def flow_targets(f: dict[str, Any]) -> list[Target]:
    """Issue 14's targets for the flow-control scenarios."""
    nan = float("nan")

    def num(value: Any) -> float:
        return nan if value is None else float(value)

    out = []
    storm = f.get("retry_storm")
    if storm:
        out += [
            Target(
                "retry storm: failing agent's rate during the outage ÷ normal",
                num(storm["outage_to_normal"]),
                1.2,
            ),
            Target(
                "retry storm: tasks dead-lettered because the breaker was open",
                storm["dead_lettered_breaker"],
                0,
            ),
            # fast answers: an accepted reach is answered within a breaker trial of the
            # agent's recovery (never after a retry schedule or a timeout) ...
            Target("retry storm: last answer after the agent recovered, s (≤ trial + 5)",
                   storm["answered_after_recovery_s"], storm["trial_interval_s"] + 5),
            Target("retry storm: accepted reaches that did not end", storm["not_ended"], 0),
        ]  # fmt: skip
        if storm["refusal_p99_ms"] is not None:  # ... and a refused one at once
            out.append(
                Target("retry storm: refusals (circuit open, backpressure) p99 ms",
                       storm["refusal_p99_ms"], 1000)
            )  # fmt: skip
    lp = f.get("loop")
    if lp:
        out += [
            Target("loop: tasks created by a two-agent loop", lp["tasks_created"], 3),
            Target("loop: stopped at the first repeat (1 = yes)",
                   int(lp["stopped_at_first_repeat"]), 1, False),
            Target("loop: dependency-loop alert raised (1 = yes)", int(lp["alert_raised"]), 1,
                   False),
            Target("loop run lost tasks", lp["lost"], 0),
        ]  # fmt: skip
    pr = f.get("priority")
    if pr:
        out += [
            Target("priority: online p99 under a background flood ÷ unloaded",
                   num(pr["p99_ratio"]), 2),
            Target("priority run lost tasks", pr["lost"], 0),
        ]  # fmt: skip
    bp = f.get("backpressure")
    if bp:
        out += [
            Target("backpressure: accepted tasks not completed", bp["accepted_not_completed"], 0),
            Target("backpressure: refusals without a usable Retry-After",
                   bp["refusals_unusable"], 0),
            Target("backpressure: refused with backpressure", bp["refused_backpressure"], 1,
                   False),
            Target("backpressure: hub RSS growth during the flood, MB", bp["rss_growth_mb"], 100),
            Target("backpressure run lost tasks", bp["lost"], 0),
        ]  # fmt: skip
    return out


def _progress(t0: float) -> Any:
    def log(name: str, row: dict[str, Any]) -> None:
        keep = {
            k: v
            for k, v in row.items()
            if k
            in (
                *("rate", "p50_ms", "p99_ms", "errors", "lost", "peak_rss_mb", "wall_s"),
                *("outcomes", "outage_to_normal", "dead_lettered_breaker", "send_outcomes"),
                *("tasks_created", "alert_raised", "p99_ratio", "accepted"),
                *("accepted_not_completed", "refused_backpressure", "rss_growth_mb"),
            )
        }
        print(f"[{time.monotonic() - t0:6.1f}s] {name}: {keep}", file=sys.stderr, flush=True)

    return log


__all__ = ["Summary", "main"]
