"""An A2A agent built only with ``a2a-sdk`` (its route factories, its request handler and
task store): what a team that never heard of Agent-Reach runs. The hub registers it by
its card and reaches it over JSON-RPC.

Skills (``metadata.skill`` of the message):

* ``echo``: completes with one artifact: ``"echo: " + text`` as a text part and the data
  part back with ``by: a2a-echo``.
* ``steps``: ``steps`` status updates (``step i`` and ``{"progress": i/steps}``) every
  ``interval`` seconds, then the artifact and COMPLETED (streamed when the card says so).
* ``slow``: works ``seconds`` (a status update first), then completes.
* ``fail``: FAILED with the message ``no such order``.
* ``ask``: INPUT_REQUIRED with the message ``which region?``.

Every execution is counted by the hub's task ID (``metadata.reach.task_id``, else the
message ID), appended to ``--journal`` before the work starts, so a killed process's
counts survive it. Run as ``python -m tests.support.a2a_echo --port P --journal FILE
[--streaming] [--bearer SECRET]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]
SKILLS = ("echo", "steps", "slow", "fail", "ask")


def build_app(port: int, journal: Path, streaming: bool, bearer: str | None) -> Any:
    from a2a.helpers.proto_helpers import new_data_part, new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events.event_queue_v2 import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        Message,
        Role,
        SecurityRequirement,
        SecurityScheme,
        StringList,
        TaskState,
    )
    from google.protobuf.json_format import MessageToDict
    from starlette.applications import Starlette
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    def agent_message(text: str, data: dict[str, Any] | None = None) -> Message:
        parts = [new_text_part(text)]
        if data is not None:
            parts.append(new_data_part(data))
        return Message(role=Role.ROLE_AGENT, parts=parts, message_id=f"m-{id(parts)}")

    class Echo(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None
            message = MessageToDict(context.message)
            meta = message.get("metadata") or {}
            skill = meta.get("skill", "echo")
            key = (meta.get("reach") or {}).get("task_id") or message.get("messageId")
            with journal.open("a") as f:
                entry = {"task": key, "skill": skill, "message_id": message.get("messageId")}
                f.write(json.dumps(entry) + "\n")
            text = "\n".join(p["text"] for p in message.get("parts", []) if "text" in p)
            data: dict[str, Any] = {}
            for part in message.get("parts", []):
                if isinstance(part.get("data"), dict):
                    data.update(part["data"])
            task = context.current_task or new_task_from_user_message(context.message)
            if context.current_task is None:
                await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            if skill == "fail":
                await updater.failed(agent_message("no such order"))
                return
            if skill == "ask":
                await updater.requires_input(agent_message("which region?"))
                return
            if skill == "steps":
                steps = int(data.get("steps", 3))
                for i in range(1, steps + 1):
                    await asyncio.sleep(float(data.get("interval", 0.2)))
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        agent_message(f"step {i}", {"progress": i / steps}),
                    )
            if skill == "slow":
                await updater.update_status(TaskState.TASK_STATE_WORKING, agent_message("working"))
                await asyncio.sleep(float(data.get("seconds", 30)))
            await updater.add_artifact(
                [new_text_part(f"echo: {text}"), new_data_part({**data, "by": "a2a-echo"})],
                name="echo",
            )
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            return None

    card = AgentCard(
        name="Echo Agent",
        description="echoes, streams, fails and asks: a test A2A agent",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(id=s, name=s.title(), description=f"the {s} skill", tags=["test", s])
            for s in SKILLS
        ],
    )
    if bearer:
        card.security_schemes["token"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={"token": StringList()}))
    handler = DefaultRequestHandler(
        agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")]

    class Bearer(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: Any) -> Response:
            if bearer and request.method == "POST":
                if request.headers.get("authorization") != f"Bearer {bearer}":
                    return JSONResponse({"error": "unauthorized"}, status_code=401)
            return await call_next(request)

    app = Starlette(routes=routes)
    app.add_middleware(Bearer)
    return app


def message_ids(journal: Path) -> dict[str, set[str]]:
    """The message IDs each hub task was sent with."""
    seen: dict[str, set[str]] = {}
    for line in journal.read_text().splitlines() if journal.exists() else []:
        entry = json.loads(line)
        seen.setdefault(entry["task"], set()).add(entry["message_id"])
    return seen


def read_counts(journal: Path) -> Counter[str]:
    """Executions per hub task ID (``metadata.reach.task_id``)."""
    if not journal.exists():
        return Counter()
    return Counter(
        json.loads(line)["task"] for line in journal.read_text().splitlines() if line.strip()
    )


class A2aEchoProcess:
    """The echo agent as its own process (uvicorn), killable with SIGKILL."""

    def __init__(
        self, port: int, journal: Path, *, streaming: bool = True, bearer: str | None = None
    ) -> None:
        self.port = port
        self.journal = journal
        self.args = [sys.executable, "-m", "tests.support.a2a_echo", "--port", str(port)]
        self.args += ["--journal", str(journal)]
        self.args += ["--streaming"] if streaming else []
        self.args += ["--bearer", bearer] if bearer else []
        self.proc: subprocess.Popen[bytes] | None = None
        self._old: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str) -> None:
        with self.journal.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.args, *extra], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )

    def restart(self) -> None:
        """SIGKILL the agent and bring up a fresh one (no task store) on the same port."""
        self.standby()
        self.swap()

    def standby(self) -> None:
        """Start the replacement now: it imports and builds everything, then waits to bind
        until ``swap``. A cold start on a loaded box takes seconds, longer than a short task
        (and than the hub's retries): a restart without a standby tests neither."""
        go = self.journal.with_suffix(".go")
        ready = go.with_suffix(".ready")
        go.unlink(missing_ok=True)
        ready.unlink(missing_ok=True)
        self._old = self.proc
        self.start("--bind-when", str(go))
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline:
                raise AssertionError("the replacement A2A agent never got ready")
            time.sleep(0.02)

    def swap(self) -> None:
        """SIGKILL the running agent and let the standby bind its port: milliseconds apart."""
        processes.kill(self._old)
        self.journal.with_suffix(".go").touch()

    def counts(self) -> Counter[str]:
        return read_counts(self.journal)

    def kill(self) -> None:
        processes.kill(self.proc)

    def stop(self) -> None:
        processes.stop(self.proc)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--bearer")
    parser.add_argument("--bind-when", type=Path, help="bind only once this file exists")
    args = parser.parse_args()
    app = build_app(args.port, args.journal, args.streaming, args.bearer)
    if args.bind_when is not None:
        args.bind_when.with_suffix(".ready").touch()
        while not args.bind_when.exists():
            time.sleep(0.01)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
