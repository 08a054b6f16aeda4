"""The flow-control scenarios (issue 14): retry storm, loop, priority and backpressure.

Each runs on a hub of its own (``fresh_bench``), started with the settings it needs, so
one scenario's breaker, queue counts or loop alert never leak into another's figures.
Every scenario returns a plain dict for ``latest.json``; the targets are judged in
``bench.cli.targets`` and reported, never asserted.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import create_engine, text

import reach
from bench import clients
from bench.loadgen import run_open_loop
from bench.processes import Hub, PeakRss
from bench.scenarios import Bench, Plan
from bench.stats import percentile, summarise

FLOW = ("retry_storm", "loop", "priority", "backpressure")


@contextlib.contextmanager
def fresh_bench(
    plan: Plan, home: Path, name: str, env: dict[str, str], concurrency: int, pool: str
) -> Iterator[Bench]:
    """A hub of its own for one scenario (fresh database, Redis flushed), stopped after."""
    where = home / name
    where.mkdir(parents=True, exist_ok=True)
    hub = Hub(
        where, worker_concurrency=concurrency, pool=pool, extra_env={**plan.hub_settings, **env}
    )
    bench = Bench(hub, where, plan)
    t0 = time.monotonic()
    try:
        hub.start()
        print(f"  hub for {name} up in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        yield bench
    finally:
        bench.stop_agents()  # a failed run must not leave agent processes behind
        hub.stop()


def _query(bench: Bench, sql: str, **params: Any) -> list[Any]:
    engine = create_engine(bench.hub.env["REACH_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    finally:
        engine.dispose()


def _statuses(bench: Bench, prefix: str) -> dict[str, int]:
    rows = _query(
        bench,
        "SELECT status, count(*) FROM tasks WHERE task_id LIKE :p GROUP BY status",
        p=prefix + "%",
    )
    return {str(status): int(n) for status, n in rows}


def _ms(values: list[float], q: float) -> float | None:
    value = percentile([v * 1000 for v in values], q)
    return None if math.isnan(value) else round(value, 1)


# -- retry storm ---------------------------------------------------------------------------


def retry_storm(bench: Bench) -> dict[str, Any]:
    """The field's incident: ``storm_callers`` callers reach an order agent that answers
    503 to everything for the outage (registered and heartbeating all along); a caller
    whose reach fails reaches again at once, up to ``storm_rereach`` times. Counted at
    the agent: its request rate before and during the outage."""
    plan = bench.plan
    (order,) = bench.agent("order")
    before, during, after = plan.storm_phases
    prefix = bench.prefix("storm")
    seq = itertools.count()
    sends: list[tuple[float, str, float]] = []  # (wall clock sent, kind, seconds to answer)
    lock = threading.Lock()
    url = bench.hub.url

    def send_once(caller: int) -> str:
        task_id = f"{prefix}{next(seq)}"
        sent, started = time.time(), time.perf_counter()
        try:
            reach.send(
                agent_id="order",
                method="bench.echo",
                payload={"caller": f"caller-{caller}"},
                task_id=task_id,
                hub=url,
            )
        except reach.ReachError as exc:  # refused at submit: circuit-open, backpressure...
            kind = f"refused:{exc.slug}"
        except Exception:
            kind = "error"
        else:
            try:
                reach.wait_for_result(task_id, timeout=plan.storm_wait, hub=url)
                kind = "success"
            except reach.ResultTimeout:
                kind = "gave_up"  # accepted and still not ended: the one outcome not allowed
            except reach.ReachError as exc:  # a stated failure: dead letter, business error
                kind = f"failed:{exc.slug}"
            except Exception:
                kind = "error"
        with lock:
            sends.append((sent, kind, time.perf_counter() - started))
        return kind

    def job(i: int) -> None:
        for _ in range(1 + plan.storm_rereach):
            if send_once(i % plan.storm_callers) == "success":
                return
        raise clients.CallFailed("no success after re-reaching")

    down: dict[str, float] = {}

    def outage() -> None:
        time.sleep(before)
        down["at"] = time.time()
        requests.post(
            f"{order.url}/tasks/bench.fail",
            json={"task_id": f"fail-{time.time_ns()}", "payload": {"seconds": during}},
            timeout=5,
        ).raise_for_status()
        time.sleep(during)
        down["until"] = time.time()

    def warm(i: int) -> None:
        clients.hub_call(
            url, {"agent_id": "order", "method": "bench.echo", "payload": {}, "task_id": f"{w}{i}"}
        )

    w = bench.prefix("storm-warm")  # a cold hub's first deliveries are no normal rate
    run_open_loop(warm, plan.storm_rate, 1.5)
    t_start = time.time()
    side = threading.Thread(target=outage, daemon=True)
    side.start()
    t0 = time.perf_counter()
    with PeakRss(bench.hub.pids()) as rss:
        samples, wall = run_open_loop(job, plan.storm_rate, before + during + after)
    side.join()
    lost = bench.lost(prefix, drain=plan.storm_wait)
    received = order.received()
    first, last = int(t_start), int(time.time())
    timeline = [received.get(s, 0) for s in range(first, last + 1)]
    down_from, down_to = int(down["at"]) - first, int(down["until"]) - first
    # whole seconds only: the first may be partial, and so are the outage's edges
    normal = timeline[1:down_from] or [0]
    during_counts = timeline[down_from + 1 : down_to] or [0]
    normal_rate = sum(normal) / len(normal)
    outage_mean = sum(during_counts) / len(during_counts)
    kinds: dict[str, int] = {}
    refusal_s: list[float] = []
    accepted_s: list[float] = []
    late = 0.0  # how long past the agent's recovery the last caller waited for its answer
    for sent, kind, seconds in sends:
        kinds[kind] = kinds.get(kind, 0) + 1
        (refusal_s if kind.startswith("refused:") else accepted_s).append(seconds)
        late = max(late, sent + seconds - down["until"])
    dead = _query(
        bench,
        "SELECT reason, last_error FROM dead_letters WHERE task_id LIKE :p",
        p=prefix + "%",
    )
    dead_kinds: dict[str, int] = {}
    breaker_dead = 0
    for reason, error in dead:
        err = error if isinstance(error, dict) else {}
        kind = str(err.get("kind") or "?")
        dead_kinds[kind] = dead_kinds.get(kind, 0) + 1
        said = f"{kind} {err.get('message') or ''} {reason}".lower()
        if kind in ("no_route", "circuit_open", "breaker_open") or "breaker" in said:
            breaker_dead += 1  # the agent was registered and alive: no route = breaker/exclusion
    retries: dict[str, int] = {}  # the hub's own account: retries and deferrals, by reason
    for (detail,) in _query(
        bench,
        "SELECT detail FROM task_events WHERE kind = 'retry' AND task_id LIKE :p",
        p=prefix + "%",
    ):
        reason = str((detail or {}).get("reason") if isinstance(detail, dict) else "?")
        retries[reason] = retries.get(reason, 0) + 1
    summary = summarise(samples, wall, offered_rate=plan.storm_rate, lost=lost)
    return {
        "callers": plan.storm_callers,
        "rereach": plan.storm_rereach,
        "offered_rate": plan.storm_rate,
        "phases_s": [before, during, after],
        "timeline_per_s": timeline,
        "outage_from_s": down_from,
        "outage_to_s": down_to,
        "normal_rate": round(normal_rate, 2),
        "outage_mean_rate": round(outage_mean, 2),
        "outage_peak_rate": max(during_counts),
        "outage_to_normal": round(outage_mean / normal_rate, 2) if normal_rate else None,
        "peak_to_normal": round(max(during_counts) / normal_rate, 2) if normal_rate else None,
        # what the deferred reaches do once the agent is back: a burst, not a storm
        "recovery_peak_rate": max(timeline[down_to:] or [0]),
        "sends": len(sends),
        "send_outcomes": kinds,
        "requests_ok": sum(1 for s in samples if s.ok),
        "requests_failed": sum(1 for s in samples if not s.ok),
        "refusal_p50_ms": _ms(refusal_s, 50),
        "refusal_p99_ms": _ms(refusal_s, 99),
        "accepted_p50_ms": _ms(accepted_s, 50),
        "accepted_p99_ms": _ms(accepted_s, 99),
        "slowest_answer_s": round(max((x[2] for x in sends), default=0.0), 2),
        "answered_after_recovery_s": round(late, 2),
        "trial_interval_s": plan.storm_trial_interval,
        "hub_retries_by_reason": retries,
        "dead_lettered": len(dead),
        "dead_letter_kinds": dead_kinds,
        "dead_lettered_breaker": breaker_dead,
        "not_ended": lost + kinds.get("gave_up", 0) + kinds.get("error", 0),
        "lost": lost,
        "statuses": _statuses(bench, prefix),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "p99_ms": summary.p99_ms,
    }


# -- loop ----------------------------------------------------------------------------------


def _metric(hub_url: str, name: str) -> float:
    """Sum of a metric's samples on ``/metrics`` (0 when it is not there)."""
    body = requests.get(f"{hub_url}/metrics", timeout=10).text
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                with contextlib.suppress(ValueError):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def loop(bench: Bench) -> dict[str, Any]:
    """Two agents whose handlers reach each other (``bounce`` mode): one root must stop at
    the first repeat (A -> B -> A refused as a loop); then separate roots A -> B and
    B -> A, each past the alert threshold, must raise the dependency-loop alert."""
    plan = bench.plan
    (a,) = bench.agent("loop-a", mode="bounce", forward_to="loop-b")
    (b,) = bench.agent("loop-b", mode="bounce", forward_to="loop-a")
    url = bench.hub.url
    prefix = bench.prefix("loop")
    root = f"{prefix}root"
    count = "SELECT count(*) FROM tasks"
    tasks_before = int(_query(bench, count)[0][0])  # the smoke's hub is shared
    started = time.perf_counter()
    outcome = "success"
    message = ""
    try:
        reach.send(
            agent_id="loop-a", method="bench.echo", payload={"bounce": 50}, task_id=root, hub=url
        )
        reach.wait_for_result(root, timeout=60, hub=url)
    except reach.ReachError as exc:
        outcome, message = type(exc).__name__, str(exc)[:300]
    stop_s = time.perf_counter() - started
    time.sleep(0.5)  # a reach that slipped past the check would have been created by now
    tasks_created = int(_query(bench, count)[0][0]) - tasks_before
    loops_a, loops_b = _stats(a).get("loops", []), _stats(b).get("loops", [])

    # the alert: separate roots, one hop each, both ways past the threshold
    roots = plan.loop_alert_roots
    alert_prefix = bench.prefix("pair")
    ends: dict[str, int] = {}
    lock = threading.Lock()

    def pair(i: int) -> None:
        target = "loop-a" if i % 2 == 0 else "loop-b"
        task_id = f"{alert_prefix}{i}"
        try:
            reach.send(
                agent_id=target, method="bench.echo", payload={"bounce": 1}, task_id=task_id,
                hub=url,
            )  # fmt: skip
            reach.wait_for_result(task_id, timeout=30, hub=url)
            kind = "success"
        except reach.ReachError as exc:
            kind = type(exc).__name__
        with lock:
            ends[kind] = ends.get(kind, 0) + 1

    run_open_loop(pair, 10.0, 2 * roots / 10.0)
    metric = 0.0
    links: Any = None
    suspected: list[Any] = []
    deadline = time.monotonic() + 10  # counts are flushed hub-wide within about a second
    while time.monotonic() < deadline:
        metric = _metric(url, "agentreach_dependency_loop_suspected_total")
        suspected = _query(bench, "SELECT src, dst FROM agent_links WHERE suspected_at IS NOT NULL")
        if metric > 0 or suspected:
            break
        time.sleep(0.5)
    with contextlib.suppress(requests.RequestException, ValueError):
        answer = requests.get(f"{url}/api/v1/links", timeout=10)
        links = answer.json() if answer.ok else f"HTTP {answer.status_code}"
    events = int(
        _query(
            bench,
            "SELECT count(*) FROM instance_events WHERE kind = 'dependency_loop_suspected'",
        )[0][0]
    )
    return {
        "root_outcome": outcome,
        "root_message": message,
        "stop_s": round(stop_s, 2),
        "tasks_created": tasks_created,
        "loops_refused_by_a": len(loops_a),
        "loops_refused_by_b": len(loops_b),
        "loop_message": (loops_b or loops_a or [""])[0],
        # A -> B -> A: the third reach (B's, back to A) is the first repeat
        "stopped_at_first_repeat": len(loops_b) == 1 and not loops_a and tasks_created == 2,
        "alert_threshold": plan.loop_alert_threshold,
        "alert_roots": roots,
        "alert_root_outcomes": ends,
        "alert_metric": metric,
        "alert_links_suspected": [f"{s}->{d}" for s, d in suspected],
        "alert_events": events,
        "alert_raised": metric > 0 or bool(suspected) or events > 0,
        "links": links,
        "lost": bench.lost(prefix) + bench.lost(alert_prefix),
    }


def _stats(agent: Any) -> dict[str, Any]:
    answer = requests.post(
        f"{agent.url}/tasks/bench.stats",
        json={"task_id": f"stats-{time.time_ns()}", "payload": {}},
        timeout=5,
    ).json()
    return dict(answer["data"])


# -- priority ------------------------------------------------------------------------------


def priority(bench: Bench, concurrency: int) -> dict[str, Any]:
    """Online single hops unloaded, then again under a flood of background tasks to a slow
    agent with ``concurrency`` slots (as an LLM agent has a few), offered at 1.5x what it
    can take, so a backlog waits in the hub throughout; the flood goes on alone for as long
    again after, so the background throughput lost to online work compares the two windows.
    (The agent once declared 256 slots: since a delivery holds no worker slot while its
    agent works, nothing flooded on a box with CPU to spare.)"""
    plan = bench.plan
    bench.agent("echo")
    bench.agent("slow-bg", latency=plan.bg_latency, max_concurrency=concurrency)
    url = bench.hub.url
    rate, duration = plan.priority_rate, plan.priority_duration

    def online(prefix: str) -> Callable[[int], None]:
        def job(i: int) -> None:
            clients.hub_call(
                url,
                {
                    "agent_id": "echo",
                    "method": "bench.echo",
                    "payload": {"i": i},
                    "task_id": f"{prefix}{i}",
                },
            )

        return job

    quiet = bench.prefix("online-quiet")
    samples, wall, _ = bench.measure(online(quiet), rate, duration)
    unloaded = summarise(samples, wall, offered_rate=rate)

    bg = bench.prefix("bg")
    bg_rate = 1.5 * concurrency / plan.bg_latency
    refused: dict[str, int] = {}
    lock = threading.Lock()

    def background(i: int) -> None:
        try:
            clients.hub_submit(
                url,
                {
                    "agent_id": "slow-bg",
                    "method": "bench.echo",
                    "payload": {"i": i},
                    "task_id": f"{bg}{i}",
                    "priority": "background",
                    "timeout_ms": 300_000,
                },
            )
        except clients.CallFailed as exc:
            with lock:
                key = str(exc)[:40]
                refused[key] = refused.get(key, 0) + 1
            raise

    lead = 1.5  # the flood runs alone this long first: the backlog is there when we measure
    flood = threading.Thread(
        target=run_open_loop, args=(background, bg_rate, lead + 2 * duration), daemon=True
    )
    flood.start()
    time.sleep(lead)
    backlog_at_start = _open_count(bench, bg)
    loud = bench.prefix("online-flood")
    with PeakRss(bench.hub.pids()) as rss:
        online_from = time.time()
        samples, wall = run_open_loop(online(loud), rate, duration)
        online_to = time.time()
    backlog_at_end = _open_count(bench, bg)
    flood.join()
    alone_to = time.time()
    with_online = _finished_rate(bench, bg, online_from, online_to)
    alone = _finished_rate(bench, bg, online_to, alone_to)
    loaded = summarise(samples, wall, offered_rate=rate)
    bg_submitted = int(bg_rate * (lead + 2 * duration))
    lost = bench.lost(quiet) + bench.lost(loud) + bench.lost(bg, drain=plan.bg_drain)
    ratio = loaded.p99_ms / unloaded.p99_ms if unloaded.p99_ms else float("nan")
    return {
        "online_rate": rate,
        "duration_s": duration,
        "unloaded": unloaded.as_dict(),
        "loaded": loaded.as_dict(),
        "p99_ratio": None if math.isnan(ratio) else round(ratio, 2),
        "p50_ratio": round(loaded.p50_ms / unloaded.p50_ms, 2) if unloaded.p50_ms else None,
        "background_rate": round(bg_rate, 1),
        "background_latency_s": plan.bg_latency,
        "background_submitted": bg_submitted,
        "background_refused": refused,
        "background_backlog_at_start": backlog_at_start,
        "background_backlog_at_end": backlog_at_end,
        "background_statuses": _statuses(bench, bg),
        # background tasks finished a second while online work ran, and in the flood's
        # window alone after it (seed 004: online work may cost background < 10 %)
        "background_done_per_s_with_online": with_online,
        "background_done_per_s_alone": alone,
        "background_throughput_lost": (
            round(1 - with_online / alone, 3) if with_online is not None and alone else None
        ),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "lost": lost,
    }


def _finished_rate(bench: Bench, prefix: str, start: float, end: float) -> float | None:
    """Tasks of this prefix that ended between ``start`` and ``end`` (wall clock), a second."""
    if end <= start:
        return None
    rows = _query(
        bench,
        "SELECT count(*) FROM tasks WHERE task_id LIKE :p "
        "AND finished_at >= :a AND finished_at < :b",
        p=prefix + "%",
        a=start,
        b=end,
    )
    return round(int(rows[0][0]) / (end - start), 2)


def _open_count(bench: Bench, prefix: str) -> int:
    """Accepted tasks of this prefix not yet terminal: the backlog the workers face."""
    rows = _query(
        bench,
        "SELECT count(*) FROM tasks WHERE task_id LIKE :p "
        "AND status NOT IN ('success','failed','dead','cancelled')",
        p=prefix + "%",
    )
    return int(rows[0][0])


# -- backpressure --------------------------------------------------------------------------

_SDK_BURST = 10  # concurrent sends of the SDK probe


def backpressure(bench: Bench) -> dict[str, Any]:
    """A fast caller (``bp_rate``/s, no waiting) against a slow sync agent on a hub with
    ``max_queue`` ``bp_max_queue``: what is accepted must complete, the rest must be told
    ``429`` backpressure with a usable ``Retry-After``, and the hub's memory stays flat."""
    plan = bench.plan
    bench.agent("slow-q", latency=plan.bp_latency)
    url = bench.hub.url
    prefix = bench.prefix("bp")
    accepted: list[str] = []
    refusals: list[dict[str, Any]] = []
    other: dict[str, int] = {}
    lock = threading.Lock()

    def job(i: int) -> None:
        task_id = f"{prefix}{i}"
        answer = clients.session().post(
            f"{url}/v1/tasks",
            json={
                "agent_id": "slow-q",
                "method": "bench.echo",
                "payload": {"i": i},
                "task_id": task_id,
                "timeout_ms": 300_000,
            },
            timeout=30,
        )
        if answer.status_code < 300:
            with lock:
                accepted.append(task_id)
            return
        body = answer.json() if answer.headers.get("content-type", "").find("json") >= 0 else {}
        if answer.status_code == 429:
            with lock:
                refusals.append(
                    {
                        "type": str(body.get("type", "")),
                        "retry_after": answer.headers.get("Retry-After"),
                        "retry_after_ms": body.get("retry_after_ms"),
                        "depth": body.get("depth"),
                        "limit": body.get("limit"),
                    }
                )
            raise clients.CallFailed("backpressure")
        with lock:
            key = f"HTTP {answer.status_code} {body.get('type', '')}"
            other[key] = other.get(key, 0) + 1
        raise clients.CallFailed(key)

    def warm(i: int) -> None:
        clients.hub_call(
            url,
            {"agent_id": "slow-q", "method": "bench.echo", "payload": {}, "task_id": f"{warm_}{i}"},
        )

    # idle: after a few tasks went through, so the processes have warmed their caches
    warm_ = bench.prefix("bp-warm")
    run_open_loop(warm, 10.0, 1.0)
    with PeakRss(bench.hub.pids()) as idle:
        time.sleep(1.0)
    sdk: dict[str, Any] = {}

    def sdk_probe() -> None:
        """Late in the flood, the SDK's view of the same refusal: ``reach.Backpressure``.
        Bursts of concurrent sends, so the probe fills the queue itself should the flood
        have fallen short of it (a loaded machine): one send at a time drains no faster
        than the agent answers."""
        time.sleep(plan.bp_duration * 0.75)
        numbers = itertools.count()

        def one() -> None:
            task_id = f"{prefix}sdk{next(numbers)}"
            reach.send(agent_id="slow-q", method="bench.echo", task_id=task_id, hub=url)
            with lock:
                accepted.append(task_id)

        for _ in range(3 * plan.bp_max_queue // _SDK_BURST + 1):  # past the bound, whatever drains
            with ThreadPoolExecutor(_SDK_BURST) as pool:
                futures = [pool.submit(one) for _ in range(_SDK_BURST)]
            for future in futures:
                exc = future.exception()
                if isinstance(exc, reach.Backpressure):
                    sdk.update(raised="Backpressure", **{k: exc.extra.get(k) for k in _BP_KEYS})
                    return
                if isinstance(exc, reach.ReachError):
                    sdk["raised"] = type(exc).__name__
                    return
            sdk["raised"] = None

    probe = threading.Thread(target=sdk_probe, daemon=True)
    probe.start()
    with PeakRss(bench.hub.pids()) as rss:
        _, wall = run_open_loop(job, plan.bp_rate, plan.bp_duration)
        polite = _polite(url, prefix)  # at once, while the queue is still full
    probe.join()
    if polite["accepted"]:
        accepted.append(f"{prefix}polite")
    lost = bench.lost(prefix, drain=plan.bp_drain)
    statuses = _statuses(bench, prefix)
    done = int(
        _query(
            bench,
            "SELECT count(*) FROM tasks WHERE task_id LIKE :p AND status = 'success'",
            p=f"{prefix}%",
        )[0][0]
    )
    bad = [r for r in refusals if not _usable(r)]
    ms = [float(r["retry_after_ms"]) for r in refusals if _number(r["retry_after_ms"])]
    return {
        "max_queue": plan.bp_max_queue,
        "offered_rate": plan.bp_rate,
        "duration_s": plan.bp_duration,
        "agent_latency_s": plan.bp_latency,
        "offered": int(plan.bp_rate * plan.bp_duration),
        "accepted": len(accepted),
        "accepted_completed": done,
        "accepted_not_completed": max(0, len(accepted) - done),
        "statuses": statuses,
        "refused_backpressure": len(refusals),
        "refused_other": other,
        "refusals_unusable": len(bad),
        "unusable_example": bad[0] if bad else None,
        "retry_after_ms_min": min(ms) if ms else None,
        "retry_after_ms_max": max(ms) if ms else None,
        "depth_max": max((r["depth"] for r in refusals if _number(r["depth"])), default=None),
        "limit_seen": sorted({r["limit"] for r in refusals if r["limit"] is not None}),
        "sdk": sdk,
        "polite_caller": polite,
        "idle_rss_mb": round(idle.peak_mb, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "rss_growth_mb": round(rss.peak_mb - idle.peak_mb, 1),
        "wall_s": round(wall, 1),
        "lost": lost,
    }


_BP_KEYS = ("depth", "limit", "retry_after_ms")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _usable(refusal: dict[str, Any]) -> bool:
    """A refusal a caller can act on: the backpressure type, ``retry_after_ms`` above zero
    and at most a minute, and a ``Retry-After`` header of whole seconds that covers it."""
    ms, header = refusal["retry_after_ms"], refusal["retry_after"]
    if not refusal["type"].endswith(":backpressure") or not _number(ms) or not 0 < ms <= 60_000:
        return False
    if header is None or not str(header).isdigit():
        return False
    return int(header) >= 1 and int(header) * 1000 >= ms


def _polite(url: str, prefix: str, tries: int = 20) -> dict[str, Any]:
    """A caller that honours ``retry_after_ms``: how many tries, and how long, until the
    full agent takes its task."""
    started = time.perf_counter()
    waited = 0.0
    for attempt in range(1, tries + 1):
        try:
            reach.send(
                agent_id="slow-q", method="bench.echo", task_id=f"{prefix}polite", hub=url,
                timeout_ms=300_000,
            )  # fmt: skip
        except reach.Backpressure as exc:
            pause = float(exc.extra.get("retry_after_ms") or 1000) / 1000
            waited += pause
            time.sleep(pause)
            continue
        except reach.ReachError as exc:
            return {"accepted": False, "tries": attempt, "error": type(exc).__name__}
        return {
            "accepted": True,
            "tries": attempt,
            "waited_s": round(waited, 2),
            "took_s": round(time.perf_counter() - started, 2),
        }
    return {"accepted": False, "tries": tries, "waited_s": round(waited, 2)}
