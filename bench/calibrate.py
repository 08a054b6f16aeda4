"""A fixed CPU workload, timed on the machine the bench runs on.

Every CPU figure in the table (ms per message, msg/s at saturation) scales with the
machine: the same code measured 9.9 and 18.5 ms of hub CPU per message on two boxes of
the same kind a few hours apart. Timing one fixed piece of work at the start of a run and
writing it into ``meta`` lets two runs be compared directly: divide each CPU figure by the
run's ``calibration_ms`` (or compare the two calibrations first).

The workload is the hub's kind of work in pure Python: encoding and decoding a JSON
message, building and reading dicts, formatting strings, hashing. It takes the least of
several repeats (``time.process_time``), so a neighbour on the other core inflates it as
little as it can; the load average at the start says how busy the box was anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

REPEATS = 7
ROUNDS = 2_000
MESSAGE = {
    "task_id": "calibrate-0000",
    "agent_id": "echo",
    "method": "bench.echo",
    "payload": {"items": list(range(20)), "text": "x" * 200, "nested": {"a": 1, "b": [1.5, 2.5]}},
    "trace": {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
}


def workload(rounds: int = ROUNDS) -> int:
    """The fixed work: ``rounds`` JSON round trips of a task-sized message, a dict rebuilt
    from it, a formatted key and a SHA-256. Returns a checksum so nothing is skipped."""
    check = 0
    for n in range(rounds):
        text = json.dumps(MESSAGE, separators=(",", ":"))
        back = json.loads(text)
        row = {key: value for key, value in back.items() if key != "trace"}
        row["attempt"] = n
        key = f"{row['agent_id']}:{row['method']}:{n}"
        check ^= hashlib.sha256(key.encode() + text.encode()).digest()[0]
        check += len(row["payload"]["items"])
    return check


def calibrate(repeats: int = REPEATS, rounds: int = ROUNDS) -> dict[str, Any]:
    """The least CPU time of ``repeats`` runs of the workload, in ms, and the load average
    (1, 5, 15 min) when it ran."""
    if repeats < 1 or rounds < 1:
        raise ValueError("repeats and rounds must be at least 1")
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        workload(rounds)
        times.append(1000 * (time.process_time() - t0))
    return {
        "calibration_ms": round(min(times), 2),
        "calibration_spread_ms": [round(min(times), 2), round(max(times), 2)],
        "workload": f"bench.calibrate.workload({rounds}), least of {repeats}",
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def speed_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    """How many times faster ``ours`` ran the workload than ``theirs`` (both ``meta``
    dicts); None when either run has no calibration (runs before it was recorded)."""
    a, b = ours.get("calibration_ms"), theirs.get("calibration_ms")
    if not a or not b:
        return None
    return round(float(b) / float(a), 2)
