"""Handlers that think, against a real agent server on 127.0.0.1: ``async def`` handlers,
one concurrency bound for both kinds, values that are not JSON, and the 202 a long
handler gets, followed by keepalives and a report to the hub.

The hub is a recording stand-in (``tests.support.recording_hub``, a real HTTP server in
a thread of the test), so what the agent sends it -- and when -- can be read back.
Deliveries are posted straight to the agent (``verify_tokens=False``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import pytest
import requests

import reach
from reach.sdk import trace
from reach.sdk.hub_client import default_api_key
from tests.support.ports import free_port
from tests.support.recording_hub import DOWN, STALE, RecordingHub
from tests.support.uvicorn_thread import uvicorn_serving
from tests.support.waiting import wait_until

KEY = "rk_runner_secretsecret"


class Boom(RuntimeError):
    pass


@pytest.fixture
def hub() -> Iterator[RecordingHub]:
    with RecordingHub() as h:
        yield h


@contextmanager
def serving(hub: RecordingHub, **kwargs: Any) -> Iterator[tuple[reach.Agent, str]]:
    """An agent on its built-in server; its routes may be added inside the block."""
    port = free_port()
    agent = reach.Agent(
        "thinker",
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,
        heartbeat_interval=3600,
        hub=hub.url,
        verify_tokens=False,  # posted to directly, no hub signs: tokens are tested apart
        **kwargs,
    )
    agent.start()
    try:
        yield agent, f"http://127.0.0.1:{port}"
    finally:
        agent.close()


def deliver(
    base: str, method: str, task_id: str | None = None, payload: Any = None, **fields: Any
) -> requests.Response:
    body = {
        "task_id": task_id or uuid.uuid4().hex,
        "payload": payload or {},
        "attempt_seq": 1,
        **fields,
    }
    return requests.post(f"{base}/tasks/{method}", json=body, timeout=30)


def answer(r: requests.Response) -> tuple[int, Any]:
    return r.status_code, r.json()


# -- async def handlers ---------------------------------------------------------------------


def test_an_async_handler_runs_on_the_agents_loop_and_its_value_comes_back(
    hub: RecordingHub,
) -> None:
    with serving(hub) as (agent, base):

        @agent.route("think")
        async def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(0.05)
            return {"thought": payload["q"], "thread": threading.current_thread().name}

        status, body = answer(deliver(base, "think", payload={"q": "why"}))
        again = answer(deliver(base, "think", payload={"q": "how"}))
    assert status == 200
    assert body["data"]["thought"] == "why"
    assert body["data"]["thread"] == f"reach-loop-{agent.agent_id}"
    assert again[1]["data"]["thread"] == body["data"]["thread"]  # one loop, started once
    assert agent.in_flight == 0


def test_async_handlers_see_their_own_context_across_awaits(hub: RecordingHub) -> None:
    """Two handlers interleave on one loop; each sees its own trace, session and hub, also
    after awaiting and in a thread it hands work to; nothing leaks out."""
    both_in = threading.Barrier(2, timeout=10)

    def seen() -> dict[str, Any]:
        ctx = trace.current()
        return {
            "task": ctx and ctx["task_id"],
            "root": ctx and ctx["root_id"],
            "hops": ctx and ctx["hops"],
            "session": trace.session_of_current(),
            "hub": trace.hub_of_current(),
            "key": default_api_key(),
        }

    with serving(hub, api_key=KEY) as (agent, base):

        @agent.route("think")
        async def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            before = seen()
            await asyncio.to_thread(both_in.wait)  # both handlers are in, interleaved
            await asyncio.sleep(0.01)
            return {"before": before, "after": seen(), "thread": await asyncio.to_thread(seen)}

        with ThreadPoolExecutor(2) as pool:
            runs = [
                pool.submit(
                    deliver,
                    base,
                    "think",
                    f"t-{n}",
                    session_id=f"s-{n}",
                    trace={"root_id": f"root-{n}", "hops": n, "path": ["caller"]},
                )
                for n in (1, 2)
            ]
            bodies = [r.result().json()["data"] for r in runs]
    for n, data in zip((1, 2), bodies, strict=True):
        expected = {
            "task": f"t-{n}", "root": f"root-{n}", "hops": n, "session": f"s-{n}",
            "hub": hub.url, "key": KEY,
        }  # fmt: skip
        assert data == {"before": expected, "after": expected, "thread": expected}
    assert trace.current() is None


def test_max_concurrency_bounds_sync_and_async_handlers_together(hub: RecordingHub) -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)
    with serving(hub, max_concurrency=2) as (agent, base):

        @agent.route("plain")
        def plain(task_id: str, payload: dict[str, Any]) -> str:
            entered.release()
            assert release.wait(20)
            return "plain"

        @agent.route("think")
        async def think(task_id: str, payload: dict[str, Any]) -> str:
            entered.release()
            while not release.is_set():
                await asyncio.sleep(0.01)
            return "think"

        with ThreadPoolExecutor(2) as pool:
            try:
                running = [pool.submit(deliver, base, m) for m in ("plain", "think")]
                for _ in range(2):
                    assert entered.acquire(timeout=10), "both handlers should run at once"
                started = time.monotonic()
                refused = [answer(deliver(base, m)) for m in ("plain", "think")]
                assert time.monotonic() - started < 2
                assert requests.get(base + "/healthz", timeout=5).json()["in_flight"] == 2
            finally:
                release.set()
            done = sorted(f.result().json()["data"] for f in running)
    assert refused == [(429, {"code": 429, "message": "agent at max_concurrency"})] * 2
    assert done == ["plain", "think"]
    assert agent.in_flight == 0


# -- a handler's value must be JSON ---------------------------------------------------------


async def _not_awaited() -> str:
    return "never"


class Opaque:
    pass


def _gen() -> Iterator[int]:
    yield 1


NOT_JSON: list[tuple[str, Callable[[], Any], str]] = [
    ("coroutine", _not_awaited, "a coroutine, which is not JSON (did you mean async def + await?)"),
    ("generator", _gen, "a generator, which is not JSON"),
    ("object", Opaque, "an Opaque, which is not JSON"),
    ("NaN", lambda: math.nan, "a float, which is not JSON"),
    ("Infinity inside", lambda: {"x": [math.inf]}, "a dict, which is not JSON"),
    ("set", lambda: {1, 2}, "a set, which is not JSON"),
    ("bytes", lambda: b"raw", "a bytes, which is not JSON"),
]


@pytest.mark.parametrize("kind", ["def", "async def"])
@pytest.mark.parametrize(("make", "says"), [pytest.param(*v[1:], id=v[0]) for v in NOT_JSON])
def test_a_value_that_is_not_json_is_a_500_never_a_200(
    hub: RecordingHub, kind: str, make: Callable[[], Any], says: str
) -> None:
    runs: list[str] = []
    with serving(hub) as (agent, base):
        if kind == "def":

            @agent.route("m")
            def handler(task_id: str, payload: dict[str, Any]) -> Any:
                runs.append(task_id)
                return make()

        else:

            @agent.route("m")
            async def handler(task_id: str, payload: dict[str, Any]) -> Any:
                runs.append(task_id)
                return make()

        first = answer(deliver(base, "m", "t-1"))
        again = answer(deliver(base, "m", "t-1", attempt_seq=2))
        failures = agent.runner.consecutive_failures
    status, body = first
    assert (status, body["code"]) == (500, -1)
    assert body["message"].startswith(f"handler for 'm' returned {says}"), body
    assert again[0] == 500
    assert runs == ["t-1", "t-1"]  # a failure is not remembered: the retry runs again
    assert failures == 2


# -- long handlers: 202, keepalives, report -------------------------------------------------


def long_handler(kind: str, seconds: float, runs: list[str], then: Callable[[], Any]) -> Any:
    if kind == "def":

        def handler(task_id: str, payload: dict[str, Any]) -> Any:
            runs.append(task_id)
            time.sleep(seconds)
            return then()

        return handler

    async def ahandler(task_id: str, payload: dict[str, Any]) -> Any:
        runs.append(task_id)
        await asyncio.sleep(seconds)
        return then()

    return ahandler


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_long_handler_is_answered_202_kept_alive_and_reported(
    hub: RecordingHub, kind: str
) -> None:
    """accept_after 0.5 s; a 3 s budget (deadline - arrival): keepalives every 1 s."""
    runs: list[str] = []
    with serving(hub, accept_after=0.5) as (agent, base):
        agent.route("think")(long_handler(kind, 3.6, runs, lambda: {"answer": 42}))
        sent = time.monotonic()
        first = deliver(base, "think", "t-long", deadline=time.time() + 3.0)
        answered = time.monotonic() - sent
        (report,) = hub.wait_for_result("t-long", timeout=10)
        keepalives = hub.progress("t-long")
        redelivered = answer(deliver(base, "think", "t-long", attempt_seq=2))
        assert agent.in_flight == 0
    assert answer(first) == (202, {"code": 0, "accepted": True})
    assert 0.4 <= answered < 1.5, answered
    assert report.body == {
        "code": 0,
        "data": {"answer": 42},
        "message": "",
        "attempt_seq": 1,
        "instance_id": agent.instance_id,
    }
    assert 3.4 <= report.at - sent < 5.0
    assert [k.body for k in keepalives] == [
        {"attempt_seq": 1, "instance_id": agent.instance_id, "keepalive": True}
    ] * len(keepalives)
    assert 2 <= len(keepalives) <= 3, [k.at - sent for k in keepalives]
    assert 1.2 <= keepalives[0].at - sent <= 2.0  # one interval after the 202
    for a, b in pairwise(keepalives):
        assert 0.7 <= b.at - a.at <= 1.4, [k.at - sent for k in keepalives]
    assert all(k.at < report.at for k in keepalives)
    assert runs == ["t-long"]  # once: the redelivery got the kept answer
    assert redelivered == (200, {"code": 0, "data": {"answer": 42}})


OUTCOMES: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
    ("value", lambda: [1, "two"], {"code": 0, "data": [1, "two"], "message": ""}),
    ("envelope", lambda: {"code": 4, "message": "bad doc"}, {"code": 4, "message": "bad doc"}),
    ("business error", lambda: _raise(reach.BusinessError(7, "no")), {"code": 7, "message": "no"}),
    (
        "exception",
        lambda: _raise(Boom("kaput")),
        {"code": -1, "message": "Boom: kaput", "transient": True},
    ),
    (
        "not JSON",
        lambda: {1, 2},
        {
            "code": -1,
            "message": "handler for 'think' returned a set, which is not JSON "
            "(Object of type set is not JSON serializable)",
            "transient": True,
        },
    ),
]


def _raise(exc: BaseException) -> Any:
    raise exc


@pytest.mark.parametrize("kind", ["def", "async def"])
@pytest.mark.parametrize(("then", "reported"), [pytest.param(*o[1:], id=o[0]) for o in OUTCOMES])
def test_the_outcome_after_202_is_reported(
    hub: RecordingHub, kind: str, then: Callable[[], Any], reported: dict[str, Any]
) -> None:
    runs: list[str] = []
    with serving(hub, accept_after=0.2) as (agent, base):
        agent.route("think")(long_handler(kind, 0.6, runs, then))
        assert deliver(base, "think", "t-1", attempt_seq=3).status_code == 202
        (report,) = hub.wait_for_result("t-1", timeout=10)
        again = deliver(base, "think", "t-1", attempt_seq=4)  # the hub's retry, or a copy
        if "transient" in reported:
            hub.wait_for_result("t-1", timeout=10, count=2)
    assert report.body == {**reported, "attempt_seq": 3, "instance_id": agent.instance_id}
    if "transient" in reported:  # nothing kept: the retry ran the handler again
        assert again.status_code == 202 and runs == ["t-1", "t-1"]
    else:  # the final answer was kept: the copy gets it, nothing runs twice
        assert again.status_code == 200 and runs == ["t-1"]


def test_a_copy_while_the_handler_runs_waits_for_the_same_answer(hub: RecordingHub) -> None:
    runs: list[str] = []
    with serving(hub, accept_after=5) as (agent, base):
        agent.route("think")(long_handler("async def", 0.8, runs, lambda: {"once": True}))
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(deliver, base, "think", "t-dup")
            while not runs:
                time.sleep(0.01)
            copy = deliver(base, "think", "t-dup", attempt_seq=2)
            assert (
                answer(first.result()) == answer(copy) == (200, {"code": 0, "data": {"once": True}})
            )
    assert runs == ["t-dup"]
    assert hub.results("t-dup") == []  # answered in time: nothing to report


def test_a_copy_after_the_202_is_answered_202_and_the_report_names_it(hub: RecordingHub) -> None:
    runs: list[str] = []
    with serving(hub, accept_after=0.3) as (agent, base):
        agent.route("think")(long_handler("def", 1.5, runs, lambda: "done"))
        assert deliver(base, "think", "t-re").status_code == 202
        copy = answer(deliver(base, "think", "t-re", attempt_seq=2))
        (report,) = hub.wait_for_result("t-re", timeout=10)
    assert copy == (202, {"code": 0, "accepted": True, "message": "already running"})
    assert report.body["attempt_seq"] == 2  # the attempt the hub now waits on
    assert report.body["data"] == "done"
    assert runs == ["t-re"]


def test_a_report_waits_out_a_hub_outage(hub: RecordingHub) -> None:
    hub.refuse("/v1/tasks/t-out/result", DOWN, DOWN)
    with serving(hub, accept_after=0.1) as (agent, base):
        agent.route("think")(long_handler("def", 0.3, [], lambda: "kept"))
        assert deliver(base, "think", "t-out").status_code == 202
        reports = hub.wait_for_result("t-out", timeout=15, count=3)
    assert [r.body["data"] for r in reports] == ["kept"] * 3
    assert 1.2 <= reports[2].at - reports[0].at <= 3.0  # backoff 0.5 s, then 1 s


def test_a_stale_report_is_logged_not_retried(
    hub: RecordingHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reach.sdk.running")
    said = "report of task t-old refused, the hub moved on"
    hub.refuse("/v1/tasks/t-old/result", STALE)
    with serving(hub, accept_after=0.1) as (agent, base):
        agent.route("think")(long_handler("def", 0.3, [], lambda: "late"))
        assert deliver(base, "think", "t-old").status_code == 202
        hub.wait_for_result("t-old", timeout=10)
        # the refusal is logged once its answer is read (a loaded machine may take a while)
        wait_until(lambda: said in caplog.text, timeout=10, what="the stale report logged")
        time.sleep(1.0)  # a retry would come within 0.5 s
    assert len(hub.results("t-old")) == 1


def test_accept_after_none_answers_when_the_handler_ends(hub: RecordingHub) -> None:
    with serving(hub, accept_after=None) as (agent, base):
        agent.route("think")(long_handler("async def", 1.2, [], lambda: "patient"))
        r = deliver(base, "think", "t-sync", deadline=time.time() + 1.0)
    assert answer(r) == (200, {"code": 0, "data": "patient"})
    assert hub.progress("t-sync") == hub.results("t-sync") == []


def test_a_handler_that_reports_a_transient_failure_itself_is_run_again(
    hub: RecordingHub,
) -> None:
    """``reach.ACCEPTED`` and ``report_result(..., transient=True)``: the guard forgets
    the 202 it kept, so the hub's retry runs the handler again."""
    runs: list[str] = []
    with serving(hub) as (agent, base):

        @agent.route("later")
        def later(task_id: str, payload: dict[str, Any]) -> Any:
            runs.append(task_id)
            return reach.ACCEPTED

        assert deliver(base, "later", "t-acc").status_code == 202
        assert deliver(base, "later", "t-acc", attempt_seq=2).status_code == 202  # kept 202
        agent.report_result("t-acc", transient=True, message="model overloaded")
        assert deliver(base, "later", "t-acc", attempt_seq=3).status_code == 202
    (report,) = hub.results("t-acc")
    assert report.body == {
        "code": -1,
        "message": "model overloaded",
        "transient": True,
        "attempt_seq": 2,
        "instance_id": agent.instance_id,
    }
    assert runs == ["t-acc", "t-acc"]


# -- the ASGI app: async handlers on the server's own loop ----------------------------------


def test_asgi_runs_async_handlers_on_the_servers_loop(hub: RecordingHub) -> None:
    port = free_port()
    agent = reach.Agent(
        "asgi-thinker",
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,
        heartbeat_interval=3600,
        hub=hub.url,
        verify_tokens=False,
        accept_after=0.3,
    )
    app = agent.asgi_app()
    server_loops: set[int] = set()
    runs: list[str] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        server_loops.add(id(asyncio.get_running_loop()))
        await app(scope, receive, send)

    @agent.route("think")
    async def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        runs.append(task_id)
        await asyncio.sleep(payload.get("sleep", 0))
        return {"loop": id(asyncio.get_running_loop()), "thread": threading.current_thread().name}

    @agent.route("plain")
    def plain(task_id: str, payload: dict[str, Any]) -> str:
        return threading.current_thread().name

    with uvicorn_serving(recording, port, lifespan="off") as base:
        quick = answer(deliver(base, "think"))
        slow = answer(deliver(base, "think", "t-slow", {"sleep": 1.0}))
        (report,) = hub.wait_for_result("t-slow", timeout=10)
        thread = answer(deliver(base, "plain"))
    (server_loop,) = server_loops
    assert quick[0] == 200 and quick[1]["data"]["loop"] == server_loop
    assert quick[1]["data"]["thread"] == f"uvicorn-{port}"
    assert slow == (202, {"code": 0, "accepted": True})
    assert report.body["data"]["loop"] == server_loop
    assert thread == (200, {"code": 0, "data": f"reach-handler-{agent.agent_id}"})
    assert agent.in_flight == 0
    agent.runner.close()
    agent.hub.close()
