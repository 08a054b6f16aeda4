"""Where a single hop's wall-clock milliseconds go (issue 17), on a quiet hub of its own.

``python -m bench.hop`` starts the bench's hub (API, a prefork worker, beat) and one echo
agent, then makes sequential single hops (``POST /v1/tasks?wait=``, one at a time, a
pause between them) and splits each at the timestamps the hub records for it, all on one
machine's clock:

- *client → accepted*: the request's way in (HTTP, auth, validation) up to the submit's
  clock reading (``tasks.created_at``);
- *accepted → worker*: the submit's transaction and commit, the publish, the broker, up
  to the Celery worker's main process logging the message received;
- *worker → claimed*: the hand-over to a prefork child and the task's start, up to the
  claim (the ``dispatched`` event);
- *claimed → finished*: the POST to the agent, its answer and the success recorded
  (``tasks.finished_at``);
- *finished → client*: the completion notice, the long-poll woken, the answer back.

Then, with the hub stopped, the same sequential calls to the same agent straight over
HTTP and through plain Celery (the table's baselines). Sequential and unloaded on
purpose: it shows each path's own length, which no rate can shorten; the bench's table
shows what load adds. Figures go to stdout and to
``bench/results/<stamp>-hop.json`` (never ``latest.*``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench import clients, scenarios
from bench.processes import REPO, Hub

STAGES = (
    "client → accepted",
    "accepted → worker",
    "worker → claimed",
    "claimed → finished",
    "finished → client",
)
# Celery's default worker log line for a message its main process took off the broker
_RECEIVED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): INFO/MainProcess\] "
    r"Task reach\.deliver\[[0-9a-f-]+\] received$"
)


@dataclass(frozen=True, slots=True)
class Marks:
    """One call's moments, seconds since the epoch on one machine's clock."""

    sent: float
    accepted: float  # tasks.created_at
    received: float  # the worker's main process logged the message
    claimed: float  # the dispatched event
    finished: float  # tasks.finished_at
    answered: float


def split(m: Marks) -> dict[str, float]:
    """The call's milliseconds by stage (``STAGES``), and their sum."""
    edges = (m.sent, m.accepted, m.received, m.claimed, m.finished, m.answered)
    out = {stage: 1000 * (b - a) for stage, a, b in zip(STAGES, edges[:-1], edges[1:], strict=True)}
    out["total"] = 1000 * (m.answered - m.sent)
    return out


def summary(splits: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """p50 and mean of each stage over the calls, ms."""
    if not splits:
        raise ValueError("no calls to summarise")
    return {
        stage: {
            "p50_ms": round(statistics.median(s[stage] for s in splits), 2),
            "mean_ms": round(statistics.fmean(s[stage] for s in splits), 2),
        }
        for stage in (*STAGES, "total")
    }


def received_times(log: str) -> list[float]:
    """When the worker's main process received each delivery message, in log order.

    Celery stamps its lines in local time to the millisecond; read back the same way."""
    out = []
    for line in log.splitlines():
        found = _RECEIVED.match(line.strip())
        if found:
            stamp = dt.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S")
            out.append(time.mktime(stamp.timetuple()) + int(found[2]) / 1000)
    return out


def _one_at_a_time(
    call: Callable[[int], object], calls: int, warm_up: int, pause_s: float
) -> list[tuple[float, float]]:
    """Make ``warm_up + calls`` calls one after another, ``pause_s`` apart; each measured
    call's (sent, answered), seconds since the epoch (the hub's own clock reads the same)."""
    out = []
    for n in range(warm_up + calls):
        sent = time.time()
        call(n)
        if n >= warm_up:
            out.append((sent, time.time()))
        time.sleep(pause_s)
    return out


def measure(calls: int, pause_s: float = 0.02, warm_up: int = 50) -> dict[str, Any]:
    """Start a hub and an echo agent, make the calls, read their moments back."""
    home = Path(tempfile.mkdtemp(prefix="reach-hop-"))
    hub = Hub(home, worker_concurrency=4, worker_loglevel="INFO")
    bench = scenarios.Bench(hub, home, scenarios.Plan(level="full"))
    try:
        hub.start()
        bench.agent("echo")

        def call(n: int) -> None:
            body = {"agent_id": "echo", "method": "bench.echo", "payload": {"n": n}}
            clients.hub_call(hub.url, {**body, "task_id": f"hop-{n}"})

        timed = _one_at_a_time(call, calls, warm_up, pause_s)
        engine = create_engine(hub.env["REACH_DATABASE_URL"])
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT t.task_id, t.created_at, t.finished_at, min(e.at) "
                        "FROM tasks t JOIN task_events e ON e.task_id = t.task_id "
                        "AND e.kind = 'dispatched' WHERE t.task_id LIKE 'hop-%' "
                        "GROUP BY t.task_id, t.created_at, t.finished_at"
                    )
                ).all()
        finally:
            engine.dispose()
    finally:
        bench.stop_agents()
        hub.stop()
    baselines = _baselines(home, calls, pause_s, warm_up)
    stored = {r[0]: (float(r[1]), float(r[2]), float(r[3])) for r in rows}
    # one delivery message per call, in call order: the calls are sequential
    received = received_times((home / "worker-0.log").read_text(errors="replace"))
    if len(received) != warm_up + calls:
        raise RuntimeError(
            f"the worker logged {len(received)} deliveries for {warm_up + calls} calls"
        )
    marks = []
    for n, ((t0, t1), got) in enumerate(zip(timed, received[warm_up:], strict=True)):
        created, finished, claimed = stored[f"hop-{warm_up + n}"]
        marks.append(Marks(t0, created, got, claimed, finished, t1))
    return {
        "calls": calls,
        "pause_s": pause_s,
        "stages": summary([split(m) for m in marks]),
        "baselines": baselines,
    }


def _baselines(home: Path, calls: int, pause_s: float, warm_up: int) -> dict[str, Any]:
    """The same sequential calls to the same agent, the hub stopped: straight over HTTP,
    and through plain Celery (prefork x4, its Redis result backend), p50 and mean ms."""
    from bench.cli import _plain_worker  # the table's own baseline worker

    where = home / "baselines"
    where.mkdir()
    alone = scenarios.Bench(Hub(where), where, scenarios.Plan(level="full"))
    out: dict[str, Any] = {}
    try:
        (echo,) = alone.agent("echo")

        def sequential(name: str, call: Callable[[str, str, dict[str, Any]], object]) -> None:
            timed = _one_at_a_time(
                lambda n: call(echo.url, f"{name}-{n}", {"n": n}), calls, warm_up, pause_s
            )
            took = [1000 * (t1 - t0) for t0, t1 in timed]
            out[name] = {
                "p50_ms": round(statistics.median(took), 2),
                "mean_ms": round(statistics.fmean(took), 2),
            }

        sequential("direct_http", clients.direct_call)
        with _plain_worker(home, "prefork", 4):
            sequential("plain_celery", clients.celery_call)
    finally:
        alone.stop_agents()
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['calls']} sequential single hops ({result['command']}, {result['started']}):",
        "",
        "| stage | p50 ms | mean ms |",
        "|---|---|---|",
    ]
    for stage, row in result["stages"].items():
        lines.append(f"| {stage} | {row['p50_ms']} | {row['mean_ms']} |")
    lines += ["", "The same calls with the hub stopped:", "", "| path | p50 ms | mean ms |",
              "|---|---|---|"]  # fmt: skip
    for path, row in result["baselines"].items():
        lines.append(f"| {path} | {row['p50_ms']} | {row['mean_ms']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hop", description=__doc__)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    result = {
        "command": f"python -m bench.hop --calls {args.calls}",
        "started": started.isoformat(),
        **measure(args.calls),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{started.strftime('%Y%m%dT%H%M%S')}-hop.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result) + f"written: {path}")


if __name__ == "__main__":
    main()
