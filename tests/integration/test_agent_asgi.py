"""``agent.asgi_app()`` under real uvicorn: the same answers as ``agent.serve()``, handlers
off the event loop, and a lifespan that joins and leaves a real hub.

One agent serves the same requests three ways at once: its built-in server, its ASGI app
alone under uvicorn, and the ASGI app mounted at a prefix inside a FastAPI app.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from fastapi import FastAPI

import reach
from reach.sdk.dispatch import MAX_REQUEST_BYTES
from tests.support.listeners import closed_port
from tests.support.ports import free_port
from tests.support.uvicorn_thread import uvicorn_serving
from tests.support.waiting import wait_until

PREFIX = "/reach"


@pytest.fixture(scope="module")
def agent() -> Iterator[reach.Agent]:
    """An agent whose hub is down: serving works without one (it registers when it can)."""
    a = reach.Agent(
        "asgi-parity",
        addr=f"127.0.0.1:{free_port()}",
        allow_loopback=True,
        heartbeat_interval=3600,
        hub=f"http://127.0.0.1:{closed_port()}",
        verify_tokens=False,  # posted to directly, no hub signs: tokens are tested apart
    )

    @a.route("echo")
    def echo(task_id: str, payload: dict[str, Any]) -> Any:
        return payload

    @a.route("refuse")
    def refuse(task_id: str, payload: dict[str, Any]) -> Any:
        raise reach.BusinessError(7, "not today")

    a.start()
    try:
        yield a
    finally:
        a.close()


@pytest.fixture(scope="module")
def bases(agent: reach.Agent) -> Iterator[dict[str, str]]:
    """Base URLs under which the agent's routes live, one per way of serving it."""
    parent = FastAPI()

    @parent.get("/own")
    def own() -> dict[str, str]:  # the service's own routes keep working beside the mount
        return {"service": "parent"}

    parent.mount(PREFIX, agent.asgi_app())
    builtin = f"http://127.0.0.1:{parse_port(agent.declaration.addr)}"
    with (
        uvicorn_serving(agent.asgi_app(), free_port(), lifespan="off") as alone,
        uvicorn_serving(parent, free_port(), lifespan="off") as mounted,
    ):
        assert requests.get(mounted + "/own", timeout=5).json() == {"service": "parent"}
        yield {"builtin": builtin, "asgi": alone, "mounted": mounted + PREFIX}


def parse_port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def task(method_payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"task_id": uuid.uuid4().hex, "payload": method_payload or {"n": 1}}


REQUESTS: list[tuple[str, str, str, Any, int]] = [
    ("health", "GET", "/healthz", None, 200),
    ("health with a query", "GET", "/healthz?verbose=1", None, 200),
    ("unknown path", "GET", "/nope", None, 404),
    ("root", "GET", "/", None, 404),
    ("POST to health", "POST", "/healthz", b"{}", 404),
    ("GET a task route", "GET", "/tasks/echo", None, 404),
    ("PUT a task route", "PUT", "/tasks/echo", b"{}", 404),
    ("delivery", "POST", "/tasks/echo", "task", 200),
    ("delivery with a query", "POST", "/tasks/echo?x=1", "task", 200),
    ("business error", "POST", "/tasks/refuse", "task", 200),
    ("no handler", "POST", "/tasks/missing", "task", 404),
    ("no method", "POST", "/tasks/", "task", 404),
    ("not JSON", "POST", "/tasks/echo", b"{not json", 400),
    ("a JSON array", "POST", "/tasks/echo", b"[1, 2]", 400),
    ("no task_id", "POST", "/tasks/echo", b'{"payload": {}}', 400),
    ("empty body", "POST", "/tasks/echo", b"", 400),
    ("too large", "POST", "/tasks/echo", b"{" + b" " * MAX_REQUEST_BYTES + b"}", 413),
]


def answer(base: str, verb: str, path: str, body: Any) -> tuple[int, Any]:
    if body == "task":
        body = task()
        body["task_id"] = f"{path}-{base}"  # one delivery per way of serving: each runs
        data: bytes | None = json.dumps(body).encode()
    else:
        data = body
    r = requests.request(
        verb, base + path, data=data, headers={"Content-Type": "application/json"}, timeout=10
    )
    return r.status_code, r.json() if r.content else None


@pytest.mark.parametrize(
    ("verb", "path", "body", "status"),
    [pytest.param(*r[1:], id=r[0]) for r in REQUESTS],
)
def test_every_way_of_serving_answers_alike(
    bases: dict[str, str], verb: str, path: str, body: Any, status: int
) -> None:
    answers = {way: answer(base, verb, path, body) for way, base in bases.items()}
    assert answers["builtin"][0] == status, answers
    assert answers["asgi"] == answers["builtin"], answers
    assert answers["mounted"] == answers["builtin"], answers


def test_the_answers_are_the_agents(bases: dict[str, str], agent: reach.Agent) -> None:
    for base in bases.values():
        health = requests.get(base + "/healthz", timeout=5).json()
        assert health == {
            "status": "ok",
            "agent_id": agent.agent_id,
            "instance_id": agent.instance_id,
            "in_flight": 0,
        }
        r = requests.post(base + "/tasks/echo", json=task({"k": base}), timeout=5)
        assert (r.status_code, r.json()) == (200, {"code": 0, "data": {"k": base}})
        r = requests.post(base + "/tasks/refuse", json=task(), timeout=5)
        assert (r.status_code, r.json()) == (200, {"code": 7, "message": "not today"})


def test_a_chunked_body_over_the_limit_is_refused(bases: dict[str, str]) -> None:
    """No Content-Length to judge by: the ASGI app counts what arrives."""

    def chunks() -> Iterator[bytes]:
        yield b'{"task_id": "big", "payload": {"x": "'
        for _ in range(MAX_REQUEST_BYTES // 65536 + 1):
            yield b"x" * 65536
        yield b'"}}'

    for way in ("asgi", "mounted"):
        r = requests.post(bases[way] + "/tasks/echo", data=chunks(), timeout=10)
        assert (r.status_code, r.json()) == (
            413,
            {"code": 413, "message": "request body too large"},
        )


def test_handlers_run_off_the_event_loop_up_to_max_concurrency() -> None:
    """Eight handlers block at once (more than the default executor's threads on a small
    machine); meanwhile /healthz answers, and the ninth delivery is refused 429 at once."""
    agent = reach.Agent(
        "asgi-busy",
        addr=f"127.0.0.1:{free_port()}",
        allow_loopback=True,
        max_concurrency=8,
        heartbeat_interval=3600,
        hub=f"http://127.0.0.1:{closed_port()}",
        verify_tokens=False,  # posted to directly, no hub signs: tokens are tested apart
    )
    release = threading.Event()
    entered = threading.Semaphore(0)

    @agent.route("block")
    def block(task_id: str, payload: dict[str, Any]) -> str:
        entered.release()
        assert release.wait(20), "the test never released the handlers"
        return task_id

    with (
        uvicorn_serving(agent.asgi_app(), free_port(), lifespan="off") as base,
        ThreadPoolExecutor(8) as callers,
    ):
        try:
            running = [
                callers.submit(
                    requests.post,
                    base + "/tasks/block",
                    json={"task_id": f"t-{n}", "payload": {}},
                    timeout=30,
                )
                for n in range(8)
            ]
            for _ in range(8):
                assert entered.acquire(timeout=10), "fewer than 8 handlers ran at once"
            started = time.monotonic()
            health = requests.get(base + "/healthz", timeout=2).json()
            refused = requests.post(base + "/tasks/block", json=task(), timeout=2)
            assert time.monotonic() - started < 1.5
            assert health["in_flight"] == 8
            assert (refused.status_code, refused.json()) == (
                429,
                {"code": 429, "message": "agent at max_concurrency"},
            )
        finally:
            release.set()
        answers = sorted(f.result().json()["data"] for f in running)
    assert answers == sorted(f"t-{n}" for n in range(8))
    assert agent.in_flight == 0
    agent.hub.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_lifespan_registers_heartbeats_and_deregisters(hub_api: str) -> None:
    port = free_port()
    agent = reach.Agent(
        "asgi-lifespan",
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,
        heartbeat_interval=0.2,
        hub=hub_api,
    )

    def instance() -> dict[str, Any]:
        view = requests.get(f"{hub_api}/api/v1/agents/{agent.agent_id}", timeout=5).json()
        (found,) = (i for i in view["instances"] if i["instance_id"] == agent.instance_id)
        return dict(found)

    with uvicorn_serving(agent.asgi_app(), port):
        assert instance()["endpoint"] == f"http://127.0.0.1:{port}"
        wait_until(lambda: instance()["heartbeat_count"] >= 3, timeout=10, what="heartbeats")
    assert instance()["status"] == "deregistered"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_mounted_app_joins_the_hub_through_the_parents_lifespan(hub_api: str) -> None:
    port = free_port()
    agent = reach.Agent(
        "asgi-mounted",
        addr=f"http://127.0.0.1:{port}{PREFIX}",
        allow_loopback=True,
        heartbeat_interval=0.2,
        hub=hub_api,
    )
    app = agent.asgi_app()
    parent = FastAPI(lifespan=app.lifespan)
    parent.mount(PREFIX, app)

    def instance() -> dict[str, Any]:
        view = requests.get(f"{hub_api}/api/v1/agents/{agent.agent_id}", timeout=5).json()
        return dict(view["instances"][0])

    with uvicorn_serving(parent, port) as base:
        assert instance()["endpoint"] == f"http://127.0.0.1:{port}{PREFIX}"
        assert requests.get(instance()["endpoint"] + "/healthz", timeout=5).json()["status"] == "ok"
        assert requests.get(base + "/healthz", timeout=5).status_code == 404  # only under it
        wait_until(lambda: instance()["heartbeat_count"] >= 2, timeout=10, what="heartbeats")
    assert instance()["status"] == "deregistered"
