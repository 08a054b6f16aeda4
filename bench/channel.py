"""``channel_single_hop``: the single-hop scenario with the agent behind a channel.

The same open-loop load as ``scenarios.hub_single``, to an echo agent that serves no port
and takes its deliveries over the WebSocket it opened to the hub (``reach.Agent(...,
channel=True)``): the extra hop is worker -> API replica (internal POST) -> socket. The
target is within 1.2x of HTTP single hop's p50 and throughput.

The agent runs as its own process: ``python -m bench.channel --hub URL``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import clients
from bench.processes import wait_routable
from bench.scenarios import Bench, _ids
from bench.stats import Summary, summarise

AGENT_ID = "echo-channel"
REPO = Path(__file__).resolve().parents[1]


def start_agent(hub_url: str, home: Path) -> subprocess.Popen[bytes]:
    with (home / "channel-agent.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.channel", "--hub", hub_url],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def channel_single_hop(bench: Bench, rate: float, duration: float) -> Summary:
    agent = start_agent(bench.hub.url, bench.home)
    try:
        wait_routable(bench.hub.url, [AGENT_ID])
        prefix = bench.prefix("channel")
        task_id = _ids(prefix)

        def job(i: int) -> None:
            clients.hub_call(
                bench.hub.url,
                {
                    "agent_id": AGENT_ID,
                    "method": "bench.echo",
                    "payload": {"i": i},
                    "task_id": task_id(i),
                },
            )

        samples, wall, peak = bench.measure(job, rate, duration)
        return summarise(
            samples, wall, offered_rate=rate, lost=bench.lost(prefix), peak_rss_mb=peak
        )
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


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
