"""What one heartbeat costs the API over HTTP, at the rate the API can take them.

``python -m bench.heartbeat_http [--instances 300] [--seconds 15] [--clients 8]
[--profile FILE]`` starts the bench's hub (``bench.processes.Hub``: API, worker, beat on
PostgreSQL and Redis), registers idle instances (each at a loopback address of its own
whose socket accepts the hub's probes, as the fleet part's), lets them settle, then has
``--clients`` keep-alive clients send quiet heartbeats (nothing in flight) round-robin
over the instances as fast as they are answered. Printed: heartbeats a second and the API
process's CPU per heartbeat over the measured window. ``--profile`` also records the API
with py-spy (raw stacks, 200 Hz; the sampling costs the API some CPU of its own).

The fleet part (``python -m bench --only fleet``) measures heartbeats at a fleet's own
pace beside routed traffic; this isolates the API's cost of the call itself.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench import clients
from bench import fleet as fleet_part
from bench.processes import Hub


def measure(instances: int, seconds: float, senders: int, profile: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home, fleet_part.listeners(instances) as port:
        hub = Hub(Path(home)).start()
        try:
            fleet = fleet_part.Fleet(hub.url, port)
            fleet.register(instances)
            time.sleep(3)  # the newcomers' first probes settle
            api = psutil.Process(hub.procs[0].popen.pid)
            stop = threading.Event()
            answered = [0] * senders

            def send(k: int) -> None:
                session, n = clients.session(), k
                while not stop.is_set():
                    agent_id, instance_id = fleet.ids[n % instances]
                    n += senders
                    with contextlib.suppress(Exception):
                        r = session.post(
                            f"{hub.url}/v1/agents/heartbeat",
                            json={"agent_id": agent_id, "instance_id": instance_id, "in_flight": 0},
                            timeout=10,
                        )
                        answered[k] += r.status_code == 200

            threads = [
                threading.Thread(target=send, args=(k,), daemon=True) for k in range(senders)
            ]
            for thread in threads:
                thread.start()
            time.sleep(2)  # every instance beaten once: the API's view of each is warm
            cpu0, beats0, t0 = sum(api.cpu_times()[:2]), sum(answered), time.perf_counter()
            if profile is not None:
                spy = Path(sys.executable).with_name("py-spy")  # the venv's (the dev extra)
                subprocess.run(
                    [str(spy), "record", "-r", "200", "--format", "raw", "-o", str(profile),
                     "-d", str(int(seconds)), "-p", str(api.pid)],
                    check=False, capture_output=True,
                )  # fmt: skip
            else:
                time.sleep(seconds)
            cpu1, beats1, t1 = sum(api.cpu_times()[:2]), sum(answered), time.perf_counter()
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
        finally:
            hub.stop()
    beats = max(1, beats1 - beats0)
    return {
        "heartbeats_per_s": round(beats / (t1 - t0), 1),
        "api_cpu_ms_per_heartbeat": round(1000 * (cpu1 - cpu0) / beats, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw stacks here")
    args = parser.parse_args()
    print(measure(args.instances, args.seconds, args.clients, args.profile))


if __name__ == "__main__":
    main()
