"""OpenAPI links: which operations a response's ids open next.

Declared in the published document so a client generator (and the schemathesis fuzzer in
tests/integration/test_openapi_fuzz.py) can chain register → heartbeat, submit → result,
start → read, instead of guessing ids that do not exist.
"""

from __future__ import annotations

from typing import Any


def _ref(path: str, method: str) -> str:
    """A JSON pointer to ``paths[path][method]`` (RFC 6901 escapes)."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def link(
    path: str,
    method: str,
    *,
    parameters: dict[str, str] | None = None,
    body: dict[str, str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"operationRef": _ref(path, method)}
    if parameters:
        out["parameters"] = parameters
    if body:
        out["requestBody"] = body
    return out


def responses(links: dict[str, dict[str, Any]], *statuses: int) -> dict[int | str, Any]:
    """The ``responses=`` entries of a route whose ``statuses`` carry these links."""
    return {status: {"links": links} for status in statuses}


_INSTANCE = {"agent_id": "$response.body#/agent_id", "instance_id": "$response.body#/instance_id"}
REGISTERED = {
    "GetAgent": link(
        "/api/v1/agents/{agent_id}", "get", parameters={"agent_id": "$response.body#/agent_id"}
    ),
    "InstanceEvents": link(
        "/api/v1/instances/{instance_id}/events",
        "get",
        parameters={"instance_id": "$response.body#/instance_id"},
    ),
    "Heartbeat": link("/v1/agents/heartbeat", "post", body=_INSTANCE),
    "Deregister": link("/v1/agents/deregister", "post", body=_INSTANCE),
}

_TASK = {"task_id": "$response.body#/task_id"}
_ATTEMPT = {"attempt_seq": "$response.body#/attempt_seq"}  # a report names its attempt
SUBMITTED = {
    "GetTask": link("/v1/tasks/{task_id}", "get", parameters=_TASK),
    "TaskEvents": link("/v1/tasks/{task_id}/events", "get", parameters=_TASK),
    "ReportResult": link("/v1/tasks/{task_id}/result", "post", parameters=_TASK, body=_ATTEMPT),
    "ReportProgress": link("/v1/tasks/{task_id}/progress", "post", parameters=_TASK, body=_ATTEMPT),
}

STARTED_BROADCAST = {
    "GetBroadcast": link(
        "/v1/broadcasts/{broadcast_id}",
        "get",
        parameters={"broadcast_id": "$response.body#/broadcast_id"},
    ),
}

STARTED_RUN = {
    "GetRun": link(
        "/api/v1/dag-runs/{run_id}", "get", parameters={"run_id": "$response.body#/run_id"}
    ),
}
