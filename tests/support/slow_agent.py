"""An SDK agent that thinks: every handler run takes ``--delay`` seconds.

It counts what reaches it at two depths, each in a journal file that survives a kill:

* ``deliveries.log`` — every ``POST /tasks/{method}`` that arrived over HTTP (one line:
  ``task_id attempt_seq``), counted by an ASGI middleware in front of the SDK, so a
  redelivery the SDK's dedup guard answers from its cache is still counted;
* ``runs.log`` — every handler run (its side effect), behind that guard.

``--handler sync`` is a plain ``def`` handler, ``async`` an ``async def`` one. The agent
is served as ``agent.asgi_app()`` under uvicorn (``--server asgi``, the default) or by
the SDK's built-in server (``--server builtin``, where deliveries are counted by
wrapping ``Agent.invoke``). Run as a process::

    python -m tests.support.slow_agent --port P --hub URL --journal DIR --delay 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import reach


def read_counts(journal: Path, name: str) -> Counter[str]:
    """Lines per task_id in ``journal/name`` (``deliveries.log`` or ``runs.log``)."""
    path = journal / name
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines() if line.strip())


class _Journal:
    def __init__(self, path: Path) -> None:
        self.lock = threading.Lock()
        self.file = path.open("a")

    def write(self, line: str) -> None:
        with self.lock:
            self.file.write(line + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--agent-id", default="slow")
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--handler", choices=("sync", "async"), default="sync")
    parser.add_argument("--server", choices=("asgi", "builtin"), default="asgi")
    parser.add_argument("--max-concurrency", type=int, default=600)
    args = parser.parse_args()
    args.journal.mkdir(parents=True, exist_ok=True)
    deliveries = _Journal(args.journal / "deliveries.log")
    runs = _Journal(args.journal / "runs.log")

    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        capabilities=[{"type": "think"}],
        max_concurrency=args.max_concurrency,
        heartbeat_interval=0.5,
        hub=args.hub,
    )

    if args.handler == "sync":

        @agent.route("think")
        def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            runs.write(f"{task_id} {os.getpid()}")
            time.sleep(float(payload.get("delay", args.delay)))
            return {"thought": payload, "pid": os.getpid()}

    else:

        @agent.route("think")
        async def think_async(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            runs.write(f"{task_id} {os.getpid()}")
            await asyncio.sleep(float(payload.get("delay", args.delay)))
            return {"thought": payload, "pid": os.getpid()}

    if args.server == "builtin":
        invoke = agent.invoke

        def counted(method: str, body: Any) -> Any:
            deliveries.write(f"{body.get('task_id')} {body.get('attempt_seq')}")
            return invoke(method, body)

        agent.invoke = counted  # type: ignore[method-assign]
        agent.serve()
        return

    import uvicorn

    app = agent.asgi_app()

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/tasks/"):
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            deliveries.write(f"{body.get('task_id')} {body.get('attempt_seq')}")
        except ValueError:
            pass
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    uvicorn.run(
        counting,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
