"""A test agent that records every handler execution (its side effect) in a file.

Modes: ``sync`` answers with the result; ``accept-die`` answers 202 and then exits
without reporting; ``accept-report`` answers 202 and reports the result a moment later;
``fail`` raises (transient, 500); ``business`` answers code 7; ``forward`` sends the
payload on to ``--forward-to`` from inside the handler and returns that result.

``--gate PATH`` holds every run (after its side effect) until PATH exists, for at most
``--delay`` seconds: a test keeps tasks in flight exactly as long as it needs them, instead
of sleeping out a delay long enough for a loaded box.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import threading
import time

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", default="recorder")
parser.add_argument("--instance-id", default=None, help="keep one identity across restarts")
parser.add_argument("--mode", default="sync")
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--log", required=True)
parser.add_argument("--max-concurrency", type=int, default=8)
parser.add_argument("--heartbeat-interval", type=float, default=0.5)
parser.add_argument("--forward-to", default="recorder")
parser.add_argument("--report-after", type=float, default=0.3)
parser.add_argument("--max-queue", type=int, default=None, help="declared queue bound")
parser.add_argument("--gate", default=None, help="hold each run until this file exists")
args = parser.parse_args()

agent = reach.Agent(
    args.agent_id,
    addr=f"127.0.0.1:{args.port}",
    instance_id=args.instance_id,
    allow_loopback=True,
    tags=["recorder"],
    capabilities=[{"type": "work.do", "params_schema": {"type": "object"}}],
    max_concurrency=args.max_concurrency,
    heartbeat_interval=args.heartbeat_interval,
    hub=args.hub,
    max_queue=args.max_queue,
)
lock = threading.Lock()
faulthandler.register(signal.SIGUSR1)  # dump every thread on demand (debugging hangs)


def side_effect(task_id: str) -> None:
    with lock, open(args.log, "a") as f:
        f.write(f"{task_id} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


@agent.route("work.do")
def work(task_id: str, payload: dict) -> object:
    side_effect(task_id)
    delay = float(payload.get("sleep", args.delay))  # a payload may ask for a slow run
    if args.gate:
        held_until = time.monotonic() + delay
        while not os.path.exists(args.gate) and time.monotonic() < held_until:
            time.sleep(0.05)
    elif delay:
        time.sleep(delay)
    if args.mode == "fail":
        raise RuntimeError("transient trouble")
    if args.mode == "business":
        raise reach.BusinessError(7, "unsupported")
    if args.mode == "accept-die":
        threading.Timer(0.2, lambda: os._exit(3)).start()
        return reach.ACCEPTED
    if args.mode == "forward":  # a second hop, sent from inside this handler
        sub = reach.send(agent_id=args.forward_to, method="work.do", payload=payload)
        inner = reach.wait_for_result(sub.task_id, timeout=30)
        return {"forwarded": inner.data, "inner_task_id": sub.task_id}
    if args.mode == "accept-report":

        def later() -> None:
            agent.report_progress(task_id, 0.5, "halfway")
            agent.report_result(task_id, {"late": payload})

        threading.Timer(args.report_after, later).start()
        return reach.ACCEPTED
    return {"echo": payload, "pid": os.getpid()}


agent.serve()
