"""``channel_single_hop``: the single-hop scenario with the agent behind a channel.

An echo agent that serves no port and takes its deliveries over the WebSocket it opened
to the hub (``reach.Agent(..., channel=True)``): the extra hop is worker -> API replica
(internal POST) -> socket. Compared in pairs with the HTTP echo agent on the same hub
(`compare`); the target is within 1.2x of HTTP delivery's p50 and throughput.

The agent runs as its own process: ``python -m bench.channel --hub URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from bench import clients
from bench.processes import wait_routable
from bench.scenarios import Bench, Plan, closed_loop
from bench.stats import Summary, summarise, sustainable

AGENT_ID = "echo-channel"
# the HTTP side: the bench's echo agent (bench.mock_agent), verifying reach tokens as the
# channel agent (a plain reach.Agent) does, so both do the same work per delivery
HTTP_AGENT = "echo-verifying"
REPO = Path(__file__).resolve().parents[1]


def start_agent(hub_url: str, home: Path) -> subprocess.Popen[bytes]:
    with (home / "channel-agent.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.channel", "--hub", hub_url],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def running_agent(bench: Bench) -> Iterator[int]:
    """The channel agent for the block; yields its pid."""
    agent = start_agent(bench.hub.url, bench.home)
    try:
        wait_routable(bench.hub.url, [AGENT_ID])
        yield agent.pid
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def _call(bench: Bench, agent_id: str, task_id: str, payload: dict[str, Any]) -> None:
    clients.hub_call(
        bench.hub.url,
        {"agent_id": agent_id, "method": "bench.echo", "payload": payload, "task_id": task_id},
    )


def interleaved_open(bench: Bench, rate: float, duration: float, n: int) -> tuple[Summary, Summary]:
    """One open loop at ``2 * rate`` whose requests alternate HTTP, channel, HTTP ...:
    both agents see the same machine at the same instants. Returns (HTTP, channel)."""
    prefixes = (bench.prefix(f"chh{n}"), bench.prefix(f"chc{n}"))
    agents = (HTTP_AGENT, AGENT_ID)

    def job(i: int) -> None:
        _call(bench, agents[i % 2], f"{prefixes[i % 2]}{i}", {"i": i})

    samples, wall, peak = bench.measure(job, 2 * rate, duration)
    out = []
    for side in (0, 1):  # a sample's sequence number is its due time times the rate
        mine = [x for x in samples if round(x.due * 2 * rate) % 2 == side]
        lost = bench.lost(prefixes[side])
        out.append(summarise(mine, wall, offered_rate=rate, lost=lost, peak_rss_mb=peak))
    return out[0], out[1]


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children (a prefork worker's pool)."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def compare(bench: Bench, plan: Plan, log: Any) -> tuple[Summary, dict[str, Any]]:
    """HTTP and channel delivery on one hub. Latency: an open loop whose requests
    interleave the two agents, so that the machine's drift (other processes, a loaded CI
    box) falls on both alike, at a rate both sustain (past saturation a p50 measures only
    how long the shared queue grew: ``sustained`` says whether it held). Throughput:
    closed-loop callers at saturation, one agent at a time (run together they would share
    one queue and split the channel's extra cost between them), in alternating order.
    Returns the channel's open-loop row and the pairs, per round and averaged."""
    rate, callers, duration = plan.channel_rate, plan.token_callers, plan.duration
    pairs: dict[str, Any] = {"rate": rate, "callers": callers, "rounds": []}
    open_rows: list[Summary] = []
    http_agent = bench.agent(HTTP_AGENT, verify_tokens=True)[0]
    with running_agent(bench) as channel_pid:
        assert http_agent.proc is not None
        pids_of = {HTTP_AGENT: http_agent.proc.popen.pid, AGENT_ID: channel_pid}
        for n in range(plan.token_rounds):
            http_open, chan_open = interleaved_open(bench, rate, duration, n)
            closed: dict[str, Summary] = {}
            cpu: dict[str, float | None] = {}
            for agent in (HTTP_AGENT, AGENT_ID) if n % 2 == 0 else (AGENT_ID, HTTP_AGENT):
                pids = [*bench.hub.pids(), pids_of[agent]]
                before = _cpu_seconds(pids)
                closed[agent] = closed_loop(bench, callers, duration, f"chs{n}", agent)
                done = closed[agent].requests - closed[agent].errors
                spent = _cpu_seconds(pids) - before
                cpu[agent] = round(1000 * spent / done, 2) if done else None
            http_closed, chan_closed = closed[HTTP_AGENT], closed[AGENT_ID]
            row = {
                "sustained": sustainable(http_open, rate) and sustainable(chan_open, rate),
                "http_p50_ms": http_open.p50_ms,
                "channel_p50_ms": chan_open.p50_ms,
                "http_p99_ms": http_open.p99_ms,
                "channel_p99_ms": chan_open.p99_ms,
                "http_saturated": http_closed.rate,
                "channel_saturated": chan_closed.rate,
                # CPU of the hub's processes and the agent per delivery: what throughput
                # on a CPU-bound box is the inverse of, whatever else the machine runs
                "http_cpu_ms_per_msg": cpu[HTTP_AGENT],
                "channel_cpu_ms_per_msg": cpu[AGENT_ID],
                "lost": http_open.lost + chan_open.lost + http_closed.lost + chan_closed.lost,
                "errors": http_open.errors
                + chan_open.errors
                + http_closed.errors
                + chan_closed.errors,
            }
            pairs["rounds"].append(row)
            open_rows.append(chan_open)
            log(f"channel pair #{n + 1}", row)

    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in pairs["rounds"] if r[key] is not None]
        return round(sum(values) / len(values), 2) if values else None

    for key in pairs["rounds"][0]:
        if key != "sustained":
            pairs[key] = mean(key)
    pairs["sustained"] = all(r["sustained"] for r in pairs["rounds"])
    return open_rows[-1], pairs


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--hub", required=True)
    args = parser.parse_args()
    agent = reach.Agent(AGENT_ID, hub=args.hub, channel=True, max_concurrency=64)

    @agent.route("bench.echo")
    def echo(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    agent.serve()


if __name__ == "__main__":
    main()
