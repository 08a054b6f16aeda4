"""What an agent's HTTP surface answers, whichever server carries it.

The built-in server (``Agent.serve``) and the ASGI app (``Agent.asgi_app``) both route
through `dispatch`, so ``GET /healthz``, ``POST /tasks/{method}``, the body limit and the
404/400/413/429 answers cannot drift apart. Routing needs only the request line and the
declared length; the body is read by the server (blocking or async, its business) and
handed to `TaskCall.run` (a thread of the built-in server) or `TaskCall.run_async` (the
ASGI app's event loop), which check the delivery's reach token (``Agent.admit``) and run
the handler (``reach.sdk.running``): the answer comes when it ends, or as a 202 once it
has run ``accept_after`` seconds.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from reach.sdk.agent import Agent

MAX_REQUEST_BYTES = 1_048_576
_TASKS = "/tasks/"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: dict[str, Any]

    def encode(self) -> bytes:
        # strict, as the hub reads it: a handler's value was checked to be JSON (``running``)
        return json.dumps(self.body, allow_nan=False).encode()


@dataclass(frozen=True, slots=True)
class TaskCall:
    """A delivery routed to ``method``; its body is still to be read. ``authorization``
    is the request's header: the hub's reach token, checked before anything runs."""

    agent: Agent
    method: str
    authorization: str | None = None

    def run(self, raw: bytes) -> Reply:
        """Parse the body, check its token, run the delivery (blocking: call it off any
        event loop)."""
        admitted = self._admitted(raw)
        if isinstance(admitted, Reply):
            return admitted
        return Reply(*self.agent.invoke(self.method, admitted))

    async def run_async(self, raw: bytes, executor: Executor | None = None) -> Reply:
        """`run` on an event loop: an ``async def`` handler runs on this loop; parsing
        and the token check (which may fetch the hub's keys) on ``executor``."""
        loop = asyncio.get_running_loop()
        admitted = await loop.run_in_executor(executor, self._admitted, raw)
        if isinstance(admitted, Reply):
            return admitted
        return Reply(*await self.agent.invoke_async(self.method, admitted, executor))

    def _admitted(self, raw: bytes) -> dict[str, Any] | Reply:
        """The delivery's body, or the answer that refuses it (not JSON, bad token)."""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _refused(400, "body is not JSON")
        if not isinstance(body, dict):
            return _refused(400, "body must be a JSON object")
        refused = self.agent.admit(body, self.authorization, method=self.method, raw=raw)
        if refused is not None:
            return Reply(*refused)
        return body


TOO_LARGE = Reply(413, {"code": 413, "message": "request body too large"})
NOT_FOUND = Reply(404, {"code": 404, "message": "not found"})


def dispatch(
    agent: Agent,
    verb: str,
    path: str,
    content_length: str | None,
    root: str = "",
    authorization: str | None = None,
) -> Reply | TaskCall:
    """Route one request: an answer at once, or a `TaskCall` waiting for the body.

    ``path`` is the decoded path without the query; ``root`` is the prefix the agent is
    served under (the ASGI ``root_path`` of a mount, or the path of the agent's ``addr``),
    stripped when present so the hub's ``{endpoint}/tasks/{method}`` lands here.
    """
    route = _below(path, root)
    if verb == "GET" and route == "/healthz":
        return Reply(
            200,
            {
                "status": "ok",
                "agent_id": agent.agent_id,
                "instance_id": agent.instance_id,
                "in_flight": agent.in_flight,
            },
        )
    if verb != "POST" or not route.startswith(_TASKS):
        return NOT_FOUND
    try:
        length = int(content_length or 0)
    except ValueError:
        return _refused(400, "Content-Length is not a number")
    if length < 0:
        return _refused(400, "Content-Length is negative")
    if length > MAX_REQUEST_BYTES:
        return TOO_LARGE
    return TaskCall(agent, route[len(_TASKS) :], authorization)


def _below(path: str, root: str) -> str:
    """``path`` relative to ``root`` when it lies under it (as Starlette's mounts read it)."""
    root = root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def _refused(status: int, message: str) -> Reply:
    return Reply(status, {"code": status, "message": message})
