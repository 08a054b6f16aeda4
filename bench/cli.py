"""``python -m bench`` / ``reach bench``: run the table and write it down."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import calibrate, cost, fleet, flow, micro, readme, report, scenarios, slow, soak
from bench import channel as bench_channel
from bench import semantic as bench_semantic
from bench import tracing as bench_tracing
from bench.processes import CELERY_URL, REPO, Hub, flush_redis, postgres_settings, spawn
from bench.stats import Summary, Target, median_row, ratio

ALL = (
    "single_hop",
    "channel_single_hop",
    "cost",
    "baselines",
    "max_throughput",
    "two_hop",
    "broadcast5",
    "inflight2000",
    "fault",
    "tokens",
    "tracing",  # OpenTelemetry on vs off: the hub's CPU per message (fresh hubs)
    "semantic",  # needs agent-reach[semantic] in this Python, else reported as skipped
    "scale_out",  # a hub of its own: two API replicas on one port, two worker nodes
    "fleet",  # a hub of its own: idle instances heartbeating, routing by capability
    "table_scale",  # hubs of their own: an empty store against one of finished tasks
    "soak",  # a hub of its own: 30 minutes at the single hop's rate, an agent flapping
    *slow.SLOW,  # slow_agents, broadcast50: one hub of their own, `reach worker` as shipped
    *flow.FLOW,  # retry_storm, loop, priority, backpressure: each on a hub of its own
)


OWN_HUB = ("scale_out", "fleet", "table_scale", "soak")  # parts on hubs of their own


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a check in under 2 minutes")
    p.add_argument("--smoke", action="store_true", help="the smallest run of every scenario")
    p.add_argument("--only", nargs="*", choices=ALL, help="run only these parts")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--worker-pool", default="prefork", choices=("threads", "prefork"))
    p.add_argument("--worker-concurrency", type=int, default=None)
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument(
        "--readme",
        action="store_true",
        help="a full run of every part, then its table into docs/benchmarks.md (bench.readme)",
    )
    p.add_argument(
        "--hub-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=_hub_env,
        help="measure the hubs with this REACH_ setting instead of its default "
        "(repeatable; not with --readme: the table is measured on the defaults)",
    )
    p.add_argument(
        "--rounds",
        type=_rounds,
        default=None,
        help="alternations of the on/off parts (tokens, tracing), each a fresh hub: more "
        "rounds tell a few per cent from a busy box's drift (default: 2 full, 1 quick)",
    )
    p.add_argument(
        "--cost-rate", type=float, default=None, help="the cost part's open-loop rate, msg/s"
    )
    p.add_argument(
        "--fleet-rate",
        type=float,
        default=None,
        help="the fleet part's rate of single hops by capability, msg/s (a busy machine)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="with the cost part: write py-spy flame graphs of the API and worker here",
    )
    return p


def _hub_env(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` for ``--hub-env``: a hub setting (``REACH_...``) and its value."""
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("REACH_") or not value:
        raise argparse.ArgumentTypeError(f"expected REACH_NAME=VALUE, got {text!r}")
    return name, value


def _rounds(text: str) -> int:
    """``--rounds``: a whole number of alternations, at least one."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of rounds >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> None:
    # a SIGTERM (a timeout, a CI stop) unwinds like Ctrl-C: every hub and agent the run
    # started is stopped by its finally, not left running on the machine
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = parser()
    args = p.parse_args(argv)
    if args.readme and (args.quick or args.smoke or args.only or args.hub_env):
        p.error(
            "--readme takes the full run of every part on the defaults: "
            "no --quick, --smoke, --only or --hub-env"
        )
    result = run(args)
    paths = report.write(result, args.out)
    if args.readme:
        readme.update(args.out)
    print(report.markdown(result))
    print(
        "written: "
        + ", ".join(
            str(p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p) for p in paths
        )
    )


def command_of(args: argparse.Namespace, level: str, hub_env: tuple[tuple[str, str], ...]) -> str:
    """The command line that reproduces this run, as its report quotes it."""
    rates = (("cost-rate", args.cost_rate), ("fleet-rate", args.fleet_rate))
    return (
        "python -m bench"
        + ("" if level == "full" else f" --{level}")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + "".join(f" --hub-env {name}={value}" for name, value in hub_env)
        + "".join(f" --{flag} {value:g}" for flag, value in rates if value is not None)
        + (f" --rounds {args.rounds}" if getattr(args, "rounds", None) else "")
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    level = "smoke" if args.smoke else "quick" if args.quick else "full"
    plan = scenarios.Plan(level=level, hub_env=tuple(args.hub_env), rounds=args.rounds)
    # the smoke run leaves out the parts on hubs of their own that only measure scale
    # (each takes a minute even at its smallest; `--smoke --only fleet ...` runs them)
    parts = set(args.only or (set(ALL) - set(OWN_HUB) if level == "smoke" else ALL))
    home = Path(tempfile.mkdtemp(prefix="reach-bench-"))
    concurrency = args.worker_concurrency or (16 if args.worker_pool == "threads" else 4)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    hub = Hub(
        home, worker_concurrency=concurrency, pool=args.worker_pool, extra_env=plan.hub_settings
    )
    result: dict[str, Any] = {
        "meta": {
            "command": command_of(args, level, plan.hub_env),
            "started": started,
            "quick": level != "full",
            "level": level,
            "only": sorted(parts) if args.only else None,
            "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, everything on one box",
            "worker": f"{args.worker_pool} x{concurrency}",
            "hub_env": dict(plan.hub_env),
            # before any hub starts: the machine's speed, so runs on different boxes compare
            "calibration": calibrate.calibrate(),
            "postgres": postgres_settings(),  # autovacuum off makes its cost grow in a run
        },
        "scenarios": {},
        "baselines": {},
        "max_throughput": None,
        "details": {},
    }
    log = _progress(t0)
    guard = _guard(result, log)
    with guard("hot_path"):  # before any hub starts, like the calibration
        result["meta"]["hot_path"] = micro.measure(micro.META_ROUNDS[level])
        log("hot_path", result["meta"]["hot_path"])
    try:
        if parts - {
            "tokens",
            "tracing",
            "semantic",
            "baselines",
            "fleet",
            "table_scale",
            *slow.SLOW,
            *flow.FLOW,
        }:  # the main hub (others: their own)
            _on_main_hub(hub, home, plan, parts, result, args, log, guard)
        if "baselines" in parts:  # with the hub stopped: the machine is theirs alone
            with guard("baselines"):
                result["baselines"] = _baselines(plan, home, args.worker_pool, concurrency, log)
        if "max_throughput" in parts and plan.settings:  # the hub at its other settings
            with guard("hub_settings"):
                result["details"]["hub_settings"] = _hub_settings(plan, home, log)
        thinking = [n for n in slow.SLOW if n in parts]  # after the main hub stopped
        if thinking:
            with guard(" and ".join(thinking)):  # the hub's start; each part guards its own
                result.update(slow.measure(thinking, plan, home, log, guard))
        wanted = [n for n in flow.FLOW if n in parts]
        if wanted:
            with guard("flow"):
                result["flow"] = _flow(wanted, plan, home, concurrency, args.worker_pool, log)
        if "tokens" in parts:  # after the main hub stopped: the machine is its own
            with guard("tokens"):
                result["tokens"] = _tokens(plan, home, concurrency, args.worker_pool, log)
        if "tracing" in parts:  # fresh hubs of its own, after the main hub stopped
            with guard("tracing"):
                result["tracing"] = bench_tracing.measure(
                    plan, home, concurrency, args.worker_pool, log
                )
        if "semantic" in parts:  # a hub of its own, with the model in its API
            with guard("semantic"):
                result["semantic"] = bench_semantic.measure(
                    plan, home, concurrency, args.worker_pool, log
                )
        if "scale_out" in parts:
            with guard("scale_out"):
                result["scale_out"] = _scale_out(plan, home, concurrency, args.worker_pool, log)
        if "fleet" in parts:
            with guard("fleet"):
                result["fleet"] = fleet.fleet(plan, home, log, rate=args.fleet_rate)
        if "table_scale" in parts:
            with guard("table_scale"):
                result["table_scale"] = fleet.table_scale(plan, home, log)
        if "soak" in parts:
            with guard("soak"):
                result["soak"] = soak.soak(plan, home, concurrency, args.worker_pool, log)
    finally:
        if not args.keep_logs:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"logs kept in {home}", file=sys.stderr)
    result["ratios"] = _ratios(result)
    result["targets"] = [t.as_dict() for t in targets(result)]
    result["meta"]["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _on_main_hub(
    hub: Hub,
    home: Path,
    plan: scenarios.Plan,
    parts: set[str],
    result: dict[str, Any],
    args: argparse.Namespace,
    log: Any,
    guard: Callable[[str], contextlib.AbstractContextManager[None]],
) -> None:
    """The scenarios of the main table, each run ``plan.repeats`` times on one hub: the
    table has each one's median and spread (``bench.stats.median_row``)."""
    bench = scenarios.Bench(hub, home, plan)
    out = result["scenarios"]
    details = result["details"]
    n = plan.repeats
    try:
        hub.start()
        if "single_hop" in parts:
            with guard("single_hop"):
                out["single_hop"] = _repeat(
                    n, lambda: (scenarios.hub_single(bench, plan.single_rate, plan.duration), None)
                )[0]
                log("single_hop", out["single_hop"])
        if "channel_single_hop" in parts:  # paired with HTTP, to an agent behind NAT
            with guard("channel_single_hop"):
                row, pairs = bench_channel.compare(bench, plan, log)
                out["channel_single_hop"] = row.as_dict()
                details["channel"] = pairs
        if "cost" in parts:  # CPU per message per process: steady on a busy box
            with guard("cost"):
                result["cost"] = cost.per_message(
                    bench, args.cost_rate or plan.cost_rate, plan.cost_duration, args.profile
                )
                log("cost", result["cost"])
        if "max_throughput" in parts:
            with guard("max_throughput"):
                best, runs = _ladder(
                    plan, lambda r, d: scenarios.hub_single(bench, r, d, name="max"), plan.repeats
                )
                result["max_throughput"] = best["median"]
                details["max_throughput_spread"] = best["spread"]
                details["max_throughput_runs"] = runs
                details["max_throughput_steps"] = runs[best["median_run"]]["steps"]
                log("max_throughput", {"rate": best["median"], "spread": best["spread"]})
        if "two_hop" in parts:
            with guard("two_hop"):
                out["two_hop"] = _repeat(n, lambda: (scenarios.two_hop(bench), None))[0]
                log("two_hop", out["two_hop"])
        if "broadcast5" in parts:
            with guard("broadcast5"):
                out["broadcast5"] = _repeat(n, lambda: (scenarios.broadcast5(bench), None))[0]
                log("broadcast5", out["broadcast5"])
        if "inflight2000" in parts:
            with guard("inflight2000"):
                mt = result["max_throughput"] or 0.0
                inflight, detail = _repeat(n, lambda: scenarios.inflight(bench, mt), "wall_s")
                out["inflight2000"], details["inflight2000"] = inflight, detail
                log("inflight2000", {**inflight, **(detail or {})})
        if "fault" in parts:
            with guard("fault"):
                faults, detail = _repeat(n, lambda: scenarios.fault(bench), "peak_to_normal")
                out["fault"], details["fault"] = faults, detail
                log("fault", {**faults, "outcomes": (detail or {}).get("outcomes")})
    finally:
        bench.stop_agents()  # a failed run must not leave agent processes behind
        hub.stop()


def _repeat(
    n: int,
    once: Callable[[], tuple[Summary, dict[str, Any] | None]],
    key: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run a scenario ``n`` times: its median row (with the spread), and the detail of
    the run whose ``key`` is the median (every run's detail under ``runs``)."""
    runs = [once() for _ in range(n)]
    row = median_row([summary.as_dict() for summary, _ in runs])
    kept = [d for _, d in runs if d is not None]
    if not kept:
        return row, None
    ordered = sorted(kept, key=lambda d: float(d.get(key) or 0.0) if key else 0.0)
    detail = dict(ordered[(len(ordered) - 1) // 2])
    detail["runs"] = kept
    return row, detail


def _ladder(
    plan: scenarios.Plan, run: Callable[[float, float], Summary], repeats: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Climb the throughput ladder ``repeats`` times; the median best and its spread."""
    runs: list[dict[str, Any]] = []
    bests: list[float] = []
    for _ in range(repeats):
        best, steps = scenarios.max_throughput(run, plan.max_rates, plan.step_duration)
        bests.append(round(best, 1))
        runs.append({"best": bests[-1], "steps": steps})
    order = sorted(range(len(runs)), key=lambda i: bests[i])
    middle = order[(len(order) - 1) // 2]
    return {
        "median": bests[middle],
        "median_run": middle,
        "spread": [min(bests), max(bests)],
    }, runs


def _baselines(
    plan: scenarios.Plan, home: Path, pool: str, concurrency: int, log: Any
) -> dict[str, Any]:
    """Direct HTTP and plain Celery, run with the hub stopped (the machine is theirs).

    Plain Celery runs with the hub worker's pool and concurrency, then at each of
    ``plan.settings``; its row is the first, and each setting's ladder is reported."""
    where = home / "baselines"
    where.mkdir(parents=True, exist_ok=True)
    alone = scenarios.Bench(Hub(where), where, plan)  # no hub: NO_HUB, nothing started
    out: dict[str, Any] = {}
    n = plan.repeats
    try:
        row, _ = _repeat(
            n, lambda: (scenarios.direct_single(alone, plan.single_rate, plan.duration), None)
        )
        best, _ = _ladder(plan, lambda r, d: scenarios.direct_single(alone, r, d), n)
        out["direct_http"] = {**row, "max_throughput": best["median"], "ladder": best}
        log("baseline direct_http", out["direct_http"])
        for setting in [(pool, concurrency), *plan.settings]:
            default = setting == (pool, concurrency)
            name = "plain_celery" if default else f"plain_celery_{setting[0]}{setting[1]}"
            with _plain_worker(home, *setting):
                row, _ = _repeat(
                    n,
                    lambda: (scenarios.celery_single(alone, plan.single_rate, plan.duration), None),
                )
                best, _ = _ladder(plan, lambda r, d: scenarios.celery_single(alone, r, d), n)
            out[name] = {
                **row,
                "max_throughput": best["median"],
                "ladder": best,
                "worker": f"{setting[0]} x{setting[1]}",
            }
            log(f"baseline {name}", out[name])
    finally:
        alone.stop_agents()
    return out


@contextlib.contextmanager
def _plain_worker(home: Path, pool: str, concurrency: int) -> Iterator[None]:
    flush_redis(CELERY_URL)
    worker = spawn(
        f"plain-celery-{pool}{concurrency}",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.plain_celery",
            "worker",
            "-c",
            str(concurrency),
            "--pool",
            pool,
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ],
        {**os.environ, "BENCH_CELERY_URL": CELERY_URL},
        home,
    )
    try:
        _wait_for_plain_worker()
        yield
    finally:
        worker.stop()


def _scale_out(
    plan: scenarios.Plan, home: Path, concurrency: int, pool: str, log: Any
) -> dict[str, Any]:
    """The hub with two API replicas behind one port (``reach api --reuse-port``) and two
    worker processes as separate Celery nodes, each as the main hub's: the ladder, the
    single hop at its rate, and the CPU per message per process."""
    where = home / "scale-out"
    where.mkdir(parents=True, exist_ok=True)
    hub = Hub(
        where,
        worker_concurrency=concurrency,
        pool=pool,
        workers=2,
        api_replicas=2,
        extra_env=plan.hub_settings,
    )
    bench = scenarios.Bench(hub, where, plan)

    def step(rate: float, duration: float) -> Summary:
        return scenarios.hub_single(bench, rate, duration, name="scale")

    try:
        hub.start()
        row, _ = _repeat(
            plan.repeats,
            lambda: (scenarios.hub_single(bench, plan.single_rate, plan.duration, "so"), None),
        )
        best, _ = _ladder(plan, step, plan.repeats)
        spent = cost.per_message(bench, plan.cost_rate, plan.cost_duration)
    finally:
        bench.stop_agents()
        hub.stop()
    out = {
        "api_replicas": 2,
        "workers": 2,
        "worker": f"{pool} x{concurrency} each",
        "single_hop": row,
        "max_throughput": best["median"],
        "ladder": best,
        "cost": spent,
    }
    log("scale_out", {**row, "max": best["median"]})
    return out


def _hub_settings(plan: scenarios.Plan, home: Path, log: Any) -> dict[str, Any]:
    """The hub's ladder at each of ``plan.settings`` (a fresh hub each)."""
    out: dict[str, Any] = {}
    for pool, concurrency in plan.settings:
        where = home / f"hub-{pool}{concurrency}"
        where.mkdir(parents=True, exist_ok=True)
        hub = Hub(where, worker_concurrency=concurrency, pool=pool, extra_env=plan.hub_settings)
        bench = scenarios.Bench(hub, where, plan)

        def step(rate: float, duration: float, bench: scenarios.Bench = bench) -> Summary:
            return scenarios.hub_single(bench, rate, duration, name="max")

        try:
            hub.start()
            best, _ = _ladder(plan, step, plan.repeats)
        finally:
            bench.stop_agents()
            hub.stop()
        out[f"{pool} x{concurrency}"] = {"max_throughput": best["median"], "ladder": best}
        log(f"hub at {pool} x{concurrency}", {"rate": best["median"]})
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
    evenly. Reported: the saturated (closed-loop) completed rate, and at a rate both
    sustain the open-loop p50 and p99 and each process's CPU per message (what signing
    and verifying cost apart from the contention of a saturated box)."""
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
                fixed = cost.per_message(bench, plan.token_rate, plan.duration)
            finally:
                bench.stop_agents()  # a failed run must not leave agent processes behind
                hub.stop()
            row = {
                "saturated_rate": closed.rate,
                "saturated_errors": closed.errors,
                "p50_ms": fixed["p50_ms"],
                "p99_ms": fixed["p99_ms"],
                "errors": fixed["errors"],
                "lost": closed.lost + fixed["lost"],
                "cpu_ms_per_msg": fixed["cpu_ms_per_msg"],
                "total_cpu_ms_per_msg": fixed["total_cpu_ms_per_msg"],
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
        "cpu_on_ms": _r(mean("on", "total_cpu_ms_per_msg")),
        "cpu_off_ms": _r(mean("off", "total_cpu_ms_per_msg")),
        "cpu_by_role_ms": {mode: _role_means(rows) for mode, rows in runs.items() if rows},
    }


def _role_means(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each process's CPU per message (``cpu_ms_per_msg``), the mean over the runs."""
    return {
        role: _r(sum(float(r["cpu_ms_per_msg"].get(role) or 0.0) for r in rows) / len(rows))
        for role in rows[0]["cpu_ms_per_msg"]
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
    base = result.get("baselines") or {}
    if result.get("max_throughput") is not None:
        best = result["max_throughput"]
        out.append(Target("max single-hop throughput, msg/s (p99 ≤ 100 ms)", best, 300, False))
        celery = (base.get("plain_celery") or {}).get("max_throughput")
        if celery:  # at equal concurrency: the hub worker's pool and concurrency
            out.append(
                Target("max throughput ÷ plain Celery at equal concurrency", _ratio(best, celery),
                       1.0, False)
            )  # fmt: skip
    if "single_hop" in s:
        out += [
            Target("single hop @100/s p50 ms", get("single_hop", "p50_ms"), 5),
            Target("single hop @100/s p99 ms", get("single_hop", "p99_ms"), 15),
        ]
    pairs = result["details"].get("channel")
    if pairs:
        out += [
            Target(
                f"channel ÷ HTTP p50 @{pairs['rate']:g}/s",
                # past saturation both p50s are the shared queue's: no comparison
                _ratio(pairs.get("channel_p50_ms"), pairs.get("http_p50_ms"))
                if pairs.get("sustained")
                else nan,
                1.2,
            ),
            Target(
                "channel ÷ HTTP saturated rate",
                _ratio(pairs.get("channel_saturated"), pairs.get("http_saturated")),
                1 / 1.2,
                False,
            ),
            Target(  # the throughput target in CPU: steady while other processes load the box
                "channel ÷ HTTP CPU per delivery",
                _ratio(pairs.get("channel_cpu_ms_per_msg"), pairs.get("http_cpu_ms_per_msg")),
                1.2,
            ),
        ]
    if "two_hop" in s:
        out.append(Target("two hops @100/s p99 ms", get("two_hop", "p99_ms"), 50))
    if "broadcast5" in s:
        out.append(Target("broadcast to 5 @50/s p99 ms", get("broadcast5", "p99_ms"), 150))
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
            Target("fault: callers left without an answer", get("fault", "errors"), 0),
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
    traced = result.get("tracing")
    if traced:  # issue 41: on costs at most 5 % of the hub's CPU per message, off nothing
        cost = traced["hub_cpu_cost_pct"]
        out += [
            Target("tracing on: hub CPU per message over off, %", nan if cost is None else cost, 5),
            Target("tracing off: spans exported", traced["exports_off"], 0),
            Target(
                "tracing runs lost tasks",
                sum(r["lost"] for runs in traced["runs"].values() for r in runs),
                0,
            ),
        ]
    return (
        out
        + slow_targets(result)
        + bench_semantic.targets(result)
        + flow_targets(result.get("flow") or {})
        + scale_targets(result)
    )


def slow_targets(result: dict[str, Any]) -> list[Target]:
    """Agents that think (``bench.slow``): every batch of slow tasks ends within 6 s of its
    first submit (judged on its slowest batch), a broadcast to 50 instances of a 2 s agent
    within 4 s (its slowest), and every task ends ``success``."""
    out = []
    sa = result.get("slow_agents")
    if sa:
        for variant, row in sa["variants"].items():
            name = f"slow agents, {sa['tasks']} tasks of {sa['handler_s']:g} s at once ({variant})"
            out += [
                Target(f"{name}: slowest batch wall s", row["wall_max_s"], slow.WALL_LIMIT_S),
                Target(f"{name}: tasks not ended success (lost or failed)", row["not_success"], 0),
            ]  # fmt: skip
    fan = result.get("broadcast50")
    if fan:
        name = f"broadcast to {fan['instances']} instances of a {fan['handler_s']:g} s agent"
        nan = float("nan")
        out += [
            Target(f"{name}: slowest of {fan['broadcasts']}, s",
                   nan if fan["max_s"] is None else fan["max_s"], slow.BROADCAST_LIMIT_S),
            Target(f"{name}: targets not succeeded", fan["targets_not_succeeded"], 0),
            Target("broadcast50 run lost tasks", fan["lost"], 0),
        ]  # fmt: skip
    return out


def scale_targets(result: dict[str, Any]) -> list[Target]:
    """Issue 17's fleet- and table-scale targets."""
    nan = float("nan")
    out = []
    f = result.get("fleet")
    if f:
        biggest = max(f["sizes"], key=int)
        out += [
            Target(f"fleet: p99 by capability with {biggest} idle instances ÷ with none",
                   nan if f["p99_ratio"] is None else f["p99_ratio"], 1.25),
            Target("fleet: registrations a second at every size", f["min_registrations_per_s"],
                   200, False),
            Target("fleet: a page of GET /api/v1/agents, p99 ms", f["max_page_ms"], 20),
        ]  # fmt: skip
    so = result.get("soak")
    if so:  # judged from the windows, so a run re-checked by `bench.readme --rescore` is too
        p99, rss = soak.drift(so["windows"], "p99_ms"), soak.drift(so["windows"], "rss_mb")
        out += [
            Target("soak: p99 of any window against the first, up or down (factor)",
                   nan if p99 is None else p99, 1.1),
            Target("soak: hub RSS of any window against the first, up or down (factor)",
                   nan if rss is None else rss, 1.1),
            Target("soak: tasks lost", so["lost"], 0),
        ]  # fmt: skip
    t = result.get("table_scale")
    if t:
        out.append(
            Target(f"table scale: throughput lost with {t['rows']:,} finished tasks, %",
                   nan if t["loss_pct"] is None else t["loss_pct"], 10)
        )  # fmt: skip
    return out


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
            Target("priority: background throughput lost to online work",
                   num(pr.get("background_throughput_lost")), 0.1),
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


def _guard(
    result: dict[str, Any], log: Any
) -> Callable[[str], contextlib.AbstractContextManager[None]]:
    """A part that raises is recorded under ``meta.failed`` and the run goes on: a
    two-hour run is not lost to one part, and `bench.readme` refuses a run with a gap."""

    @contextlib.contextmanager
    def guard(name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # any part's failure, recorded and shown
            traceback.print_exc(file=sys.stderr)
            result["meta"].setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{name} FAILED", {"error": result["meta"]["failed"][name]})

    return guard


def _progress(t0: float) -> Any:
    def log(name: str, row: dict[str, Any]) -> None:
        keep = {
            k: v
            for k, v in row.items()
            if k
            in (
                *("rate", "p50_ms", "p99_ms", "errors", "lost", "peak_rss_mb", "wall_s"),
                *("outcomes", "outage_to_normal", "dead_lettered_breaker", "send_outcomes"),
                *("tasks_created", "alert_raised", "p99_ratio", "accepted", "page"),
                *("accepted_not_completed", "refused_backpressure", "rss_growth_mb"),
                *("http_p50_ms", "channel_p50_ms", "http_saturated", "channel_saturated"),
                *("http_cpu_ms_per_msg", "channel_cpu_ms_per_msg", "sustained"),
                *("cpu_ms_per_msg", "hub_cpu_ms_per_msg", "total_cpu_ms_per_msg", "error"),
                "cpu_ms",  # the hot path's, per operation
                *("wall_limit_s", "wall_max_s", "not_success"),  # in flight, slow agents
                *("durations_s", "max_s", "targets_not_succeeded"),  # broadcast50
            )
        }
        print(f"[{time.monotonic() - t0:6.1f}s] {name}: {keep}", file=sys.stderr, flush=True)

    return log


__all__ = ["Summary", "main"]
