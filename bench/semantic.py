"""What semantic matching adds to a send: ``POST /v1/tasks`` by ``intent`` against the same
send naming the capability, on one hub (PostgreSQL, Redis) with the demo sales agent.

Three kinds of submit, interleaved one after the other so the machine's drift touches
each alike, every one answered ``201`` and delivered to the agent by the worker:

- ``capability``: ``capability=sales.fetch, method=sales.fetch`` (no model involved);
- ``intent_new``: an intent never seen before (``sales figures for the east region,
  report 17``): the API embeds it (the model's run on the request path) and compares it
  with the capability vectors stored at registration;
- ``intent_seen``: one intent again and again: its vector comes from the API's cache.

The added latency per semantic send is ``intent_new p50 - capability p50`` (the target:
at most 15 ms on CPU); the capability vectors are never computed per message (they are
stored at registration: the run waits for them before measuring). Beside it, the API
process's CPU time per submit of each kind: on a box shared with other work, wall time
stretches with the load while CPU time does not, so the added CPU per send is the
figure that says what the model costs.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import requests

from bench import scenarios
from bench.processes import REPO, Hub, free_port, spawn
from bench.stats import Target
from reach.hub.fleet.embeddings import availability

KINDS = ("capability", "intent_new", "intent_seen")
TARGET_ADDED_P50_MS = 15.0


def _samples(level: str) -> int:
    return {"smoke": 10, "quick": 60}.get(level, 300)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    plan: scenarios.Plan, home: Path, concurrency: int, pool: str, log: Any
) -> dict[str, Any]:
    state = availability("auto")
    if not state.on:  # this Python has no model: say why instead of a number
        return {"skipped": state.reason}
    where = home / "semantic"
    where.mkdir(parents=True, exist_ok=True)
    hub = Hub(where, worker_concurrency=concurrency, pool=pool, extra_env=plan.hub_settings)
    agent = None
    try:
        hub.start()
        agent = spawn(
            "sales-agent",
            [
                sys.executable,
                str(REPO / "examples" / "agents" / "sales_agent.py"),
                "--port",
                str(free_port()),
                "--hub",
                hub.url,
            ],
            hub.env,
            where,
        )
        http = requests.Session()
        _wait_ready(http, hub.url, agent)
        api = psutil.Process(hub.procs[0].popen.pid)
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        cpu: dict[str, float] = dict.fromkeys(KINDS, 0.0)  # the API's CPU seconds, by kind
        errors = 0
        for i in range(_samples(plan.level)):
            for kind in KINDS:
                body: dict[str, Any] = {"payload": {"region": "east"}}
                if kind == "capability":
                    body.update(capability="sales.fetch", method="sales.fetch")
                elif kind == "intent_new":
                    body["intent"] = f"sales figures for the east region, report {i}"
                else:
                    body["intent"] = "sales figures for the east region"
                before = sum(api.cpu_times()[:2])
                started = time.perf_counter()
                r = http.post(f"{hub.url}/v1/tasks", json=body, timeout=30)
                elapsed = (time.perf_counter() - started) * 1000
                cpu[kind] += sum(api.cpu_times()[:2]) - before
                if r.status_code != 201 or r.json()["method"] != "sales.fetch":
                    errors += 1
                    continue
                times[kind].append(elapsed)
        api_rss_mb = psutil.Process(hub.procs[0].popen.pid).memory_info().rss / 2**20
    finally:
        if agent is not None:
            agent.stop()
        hub.stop()
    row: dict[str, Any] = {
        "samples": _samples(plan.level),
        "errors": errors,
        "load_avg_1m": round(os.getloadavg()[0], 2),  # what else this box was doing
        "api_rss_mb": round(api_rss_mb, 1),  # the API with the model loaded
    }
    for kind in KINDS:
        row[f"{kind}_p50_ms"] = round(_percentile(times[kind], 0.5), 2) if times[kind] else None
        row[f"{kind}_p95_ms"] = round(_percentile(times[kind], 0.95), 2) if times[kind] else None
    for kind in KINDS:  # load-insensitive: what each submit costs the API in CPU
        done = len(times[kind])
        row[f"{kind}_api_cpu_ms"] = round(1000 * cpu[kind] / done, 2) if done else None
    if row["capability_api_cpu_ms"] is not None and row["intent_new_api_cpu_ms"] is not None:
        row["added_api_cpu_ms"] = round(
            row["intent_new_api_cpu_ms"] - row["capability_api_cpu_ms"], 2
        )
    if row["capability_p50_ms"] is not None and row["intent_new_p50_ms"] is not None:
        row["added_p50_ms"] = round(row["intent_new_p50_ms"] - row["capability_p50_ms"], 2)
    if row["capability_p50_ms"] is not None and row["intent_seen_p50_ms"] is not None:
        row["added_seen_p50_ms"] = round(row["intent_seen_p50_ms"] - row["capability_p50_ms"], 2)
    log("semantic", row)
    return row


def _wait_ready(http: requests.Session, url: str, agent: Any, timeout: float = 180) -> None:
    """The agent registered, its capability vectors stored and the API's model loaded:
    a match answers (the first one waits for the model), then the run starts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.popen.poll() is not None:
            raise RuntimeError(f"the sales agent exited:\n{agent.tail()}")
        try:
            r = http.get(
                f"{url}/v1/match", params={"intent": "sales figures for the east"}, timeout=120
            )
            if r.status_code == 200 and r.json()["candidates"]:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError("semantic matching did not answer in time")


def targets(result: dict[str, Any]) -> list[Target]:
    row = result.get("semantic") or {}
    if row.get("added_p50_ms") is None:
        return []
    out = [
        Target(
            "semantic send: added p50 ms (a new intent)", row["added_p50_ms"], TARGET_ADDED_P50_MS
        ),
        Target("semantic run errors", row["errors"], 0),
    ]
    if row.get("added_api_cpu_ms") is not None:  # the same budget, in the API's CPU time
        out.insert(
            1,
            Target(
                "semantic send: added API CPU ms (a new intent)",
                row["added_api_cpu_ms"],
                TARGET_ADDED_P50_MS,
            ),
        )
    return out


def lines(result: dict[str, Any]) -> list[str]:
    row = result.get("semantic")
    if not row:
        return []
    if "skipped" in row:
        return ["", f"Semantic matching: not measured ({row['skipped']})."]

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:,.2f}"

    out = [
        "",
        f"Semantic matching ({row['samples']} submits of each kind, interleaved; "
        f"POST /v1/tasks round trip; load average at the end {row.get('load_avg_1m')}):",
        "",
        "| submit | p50 ms | p95 ms | API CPU ms per submit |",
        "|---|---|---|---|",
    ]
    names = {
        "capability": "capability named",
        "intent_new": "intent, new each time (embedded)",
        "intent_seen": "intent, seen before (cached)",
    }
    for kind in KINDS:
        out.append(
            f"| {names[kind]} | {fmt(row[f'{kind}_p50_ms'])} | {fmt(row[f'{kind}_p95_ms'])} "
            f"| {fmt(row.get(f'{kind}_api_cpu_ms'))} |"
        )
    out += [
        "",
        f"Added per semantic send (p50): {fmt(row.get('added_p50_ms'))} ms for a new intent, "
        f"{fmt(row.get('added_seen_p50_ms'))} ms for one seen before; in the API's CPU "
        f"(which other load on the box does not inflate): {fmt(row.get('added_api_cpu_ms'))} "
        f"ms for a new intent. The API's resident memory with the model loaded: "
        f"{fmt(row.get('api_rss_mb'))} MB.",
    ]
    return out
