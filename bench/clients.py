"""The caller's side of each path, all on requests with one session per thread.

``hub_call`` is what an application using Agent-Reach does: one ``POST /v1/tasks?wait=``
that returns when the result is visible. ``direct_call`` posts straight to the agent
(baseline a); ``celery_call`` runs the plain Celery task and waits for its result
(baseline b).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests

from reach.core.ledger.statuses import TERMINAL
from reach.wire.schemas import MAX_WAIT_S

_local = threading.local()


def session() -> requests.Session:
    s: requests.Session | None = getattr(_local, "session", None)
    if s is None:
        s = _local.session = requests.Session()
        s.trust_env = False  # loopback only: no proxy lookup on every call
    return s


class CallFailed(Exception):
    """The call ended without a successful result (its message says how)."""


def hub_call(hub: str, body: dict[str, Any], wait: float = 30.0) -> dict[str, Any]:
    """Submit and wait up to ``wait`` seconds for the result: one ``POST ?wait=``, and
    ``GET ?wait=`` again while the task is not terminal and time is left."""
    deadline = time.monotonic() + wait
    first = min(wait, MAX_WAIT_S)
    answer = session().post(
        f"{hub}/v1/tasks", params={"wait": first}, json=body, timeout=first + 10
    )
    view: dict[str, Any] = answer.json()
    if answer.status_code >= 400:
        raise CallFailed(f"HTTP {answer.status_code} {view.get('type', '')}")
    while view.get("status") not in TERMINAL and (left := deadline - time.monotonic()) > 0:
        more = min(left, MAX_WAIT_S)
        view = (
            session()
            .get(f"{hub}/v1/tasks/{view['task_id']}", params={"wait": more}, timeout=more + 10)
            .json()
        )
    if view.get("status") != "success":
        raise CallFailed(f"task ended {view.get('status')}")
    return view


def hub_submit(hub: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = session().post(f"{hub}/v1/tasks", json=body, timeout=30)
    if answer.status_code >= 400:
        raise CallFailed(f"HTTP {answer.status_code} {answer.text[:200]}")
    return dict(answer.json())


def hub_wait(hub: str, task_id: str, wait: float = 30.0) -> dict[str, Any]:
    view: dict[str, Any] = (
        session().get(f"{hub}/v1/tasks/{task_id}", params={"wait": wait}, timeout=wait + 10).json()
    )
    if view.get("status") != "success":
        raise CallFailed(f"task ended {view.get('status')}")
    return view


def broadcast_call(hub: str, body: dict[str, Any], wait: float = 30.0) -> dict[str, Any]:
    started = session().post(f"{hub}/v1/broadcasts", json=body, timeout=30)
    if started.status_code >= 400:
        raise CallFailed(f"HTTP {started.status_code} {started.text[:200]}")
    view: dict[str, Any] = started.json()
    if not view.get("complete"):
        view = (
            session()
            .get(
                f"{hub}/v1/broadcasts/{view['broadcast_id']}",
                params={"wait": wait},
                timeout=wait + 10,
            )
            .json()
        )
    if not view.get("complete"):
        raise CallFailed("broadcast incomplete")
    return view


def direct_call(agent_url: str, task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    answer = session().post(
        f"{agent_url}/tasks/bench.echo",
        json={"task_id": task_id, "method": "bench.echo", "payload": payload},
        timeout=30,
    )
    if answer.status_code != 200:
        raise CallFailed(f"HTTP {answer.status_code}")
    return dict(answer.json())


def celery_call(agent_url: str, task_id: str, payload: dict[str, Any]) -> Any:
    from bench.plain_celery import post

    result = post.delay(
        f"{agent_url}/tasks/bench.echo",
        {"task_id": task_id, "method": "bench.echo", "payload": payload},
    )
    try:
        return result.get(timeout=30)
    finally:
        result.forget()
