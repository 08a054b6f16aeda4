"""``reach.aio`` against a real hub: api, worker and beat as processes (one hub per store
for the module), and a ``reach.Agent`` with plain ``def`` handlers in this process.

Each test drives its coroutines with ``asyncio.run`` (a loop of its own, as an
application would): a send and its result end to end; a hundred sends and waits at once
on one loop and one pool; every typed error the sync API raises, the same; a broadcast; a
stream that follows progress reports made with ``reach.aio`` and resumes after a real
dropped connection with ``Last-Event-ID``; sessions; and each loop's pool, opened on first
use and closed with its loop or by ``aclose``, counted from the kernel's side (the TCP
connections this process holds to the hub), without an "Unclosed client session".
"""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import psutil
import pytest
import requests

import reach
import reach.aio as aio
from reach.core.security.auth import Scope
from reach.sdk import trace
from reach.sdk.aio_client import loop_session, open_pools
from tests.integration.test_foreign_errors import _NotAHub
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import make_key
from tests.support.waiting import wait_until

AGENT = "aio-callee"
TAG = "aio-test"
SECRET = "rk_abcd1234_" + "s" * 40  # well formed, unknown to the hub


@pytest.fixture(scope="module")
def agent(shared_stack: Stack) -> Iterator[reach.Agent]:
    agent = reach.Agent(
        AGENT,
        tags=[TAG],
        addr=f"127.0.0.1:{free_port()}",
        allow_loopback=True,
        capabilities=[{"type": "echo"}, {"type": "refuse"}, {"type": "hold"}],
        max_concurrency=16,
        # a slow beat: the module's tests hold tasks for minutes on a loaded box, and a
        # half-second beat missed three times there took the agent offline mid-test
        heartbeat_interval=2.0,
        hub=shared_stack.url,
    )

    @agent.route("echo")
    def echo(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"echo": payload.get("word"), "session_alive": reach.session_alive()}

    @agent.route("refuse")
    def refuse(task_id: str, payload: dict[str, Any]) -> None:
        raise reach.BusinessError(7, "out of stock")

    @agent.route("hold")
    def hold(task_id: str, payload: dict[str, Any]) -> object:
        return reach.ACCEPTED  # the test reports progress and the result

    agent.start()
    try:
        wait_until(
            lambda: any(i["status"] == "online" for i in shared_stack.instances(AGENT)),
            timeout=30,
            what=f"{AGENT} online",
        )
        yield agent
    finally:
        agent.close()


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """``asyncio.run(main())``, failing on any "Unclosed client session" left behind."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return asyncio.run(main())
        finally:
            gc.collect()  # a pool left open would warn from its finaliser now
            unclosed = [str(w.message) for w in caught if "Unclosed" in str(w.message)]
            assert not unclosed, unclosed


def local_ports(hub: str) -> set[int]:
    """Local ports of this process's established connections to the hub's port."""
    port = int(hub.rsplit(":", 1)[1])
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


def standing(stack: Stack, agent: reach.Agent) -> str:
    """The agent's instance as the hub sees it, and its recent transitions: what a task
    dead-lettered with ``no_route`` was told."""
    view = {
        k: v
        for k, v in (stack.instance(AGENT) or {}).items()
        if k in ("status", "routable", "probe_status", "last_probe_error", "reason", "in_flight")
    }
    r = requests.get(f"{stack.url}/api/v1/instances/{agent.instance_id}/events", timeout=5)
    return f"instance {view}; events, newest first: {r.json().get('events', [])[:20]}"


def test_send_and_wait_for_result_through_the_hub(shared_stack: Stack, agent: reach.Agent) -> None:
    hub = shared_stack.url

    async def main() -> tuple[reach.Submission, reach.TaskResult]:
        sub = await aio.send(agent_id=AGENT, method="echo", payload={"word": "hi"}, hub=hub)
        return sub, await aio.wait_for_result(sub.task_id, timeout=30, hub=hub)

    sub, result = run(main)
    assert isinstance(sub, reach.Submission) and sub.agent_id == AGENT
    assert isinstance(result, reach.TaskResult)
    assert result.data == {"echo": "hi", "session_alive": True}
    assert (result.agent_id, result.instance_id) == (AGENT, agent.instance_id)
    # the same record the sync API reads
    again = reach.wait_for_result(sub.task_id, timeout=5, hub=hub)
    assert (again.task_id, again.data, again.attempt_seq) == (
        result.task_id,
        result.data,
        result.attempt_seq,
    )
    view = run(lambda: aio.get_task(sub.task_id, hub=hub))
    assert view["status"] == "success" and view["result"] == result.data
    assert [e["kind"] for e in shared_stack.events(sub.task_id)][-1] == "terminal_success"


def test_a_hundred_sends_and_waits_at_once_share_one_loop_and_one_pool(
    shared_stack: Stack, agent: reach.Agent
) -> None:
    hub = shared_stack.url

    async def one(n: int) -> Any:
        sub = await aio.send(agent_id=AGENT, method="echo", payload={"word": str(n)}, hub=hub)
        return (await aio.wait_for_result(sub.task_id, timeout=90, hub=hub)).data["echo"]

    async def main() -> tuple[list[Any], int, set[int]]:
        answers = await asyncio.gather(*(one(n) for n in range(100)))
        return answers, open_pools(), local_ports(hub)

    before = local_ports(hub)  # the agent's own (heartbeats, on requests)
    try:
        answers, pools, held = run(main)
    except reach.DeadLettered as e:  # out of routing for the task's retries: say why
        pytest.fail(f"{e}\n{standing(shared_stack, agent)}")
    assert answers == [str(n) for n in range(100)]
    assert pools == 1
    # kept for reuse while the loop ran: at most one per concurrent request, plus what the
    # in-process agent's own client may have opened meanwhile (its reports and heartbeats)
    assert 1 <= len(held - before) <= 100 + 2
    assert open_pools() == 0  # and closed with it (counted in the last test, alone)


def test_errors_are_the_typed_errors_of_the_sync_api(
    shared_stack: Stack, shared_store_url: str, agent: reach.Agent
) -> None:
    hub = shared_stack.url
    down = f"http://127.0.0.1:{free_port()}"  # nobody listens
    viewer = make_key(shared_store_url, Scope.VIEWER)
    refused = reach.send(agent_id=AGENT, method="refuse", hub=hub).task_id
    # held for the whole test: with the default 30 s, a loaded box ran the cases below past
    # its timeout, and the task went back to pending for its retry mid-comparison
    held = reach.send(agent_id=AGENT, method="hold", hub=hub, timeout_ms=600_000).task_id
    # delivered before its timeouts are compared: its status is in both clients' ResultTimeout
    wait_until(
        lambda: reach.get_task(held, hub=hub)["status"] == "executing",
        timeout=120,
        what="the held task delivered",
    )
    cases: list[tuple[type[reach.ReachError], Callable[[], Any], Callable[[], Awaitable[Any]]]] = [
        (
            reach.UnknownTask,
            lambda: reach.get_task("t-nowhere", hub=hub),
            lambda: aio.get_task("t-nowhere", hub=hub),
        ),
        (
            reach.UnknownTask,
            lambda: reach.wait_for_result("t-nowhere", timeout=5, hub=hub),
            lambda: aio.wait_for_result("t-nowhere", timeout=5, hub=hub),
        ),
        (
            reach.BusinessError,
            lambda: reach.wait_for_result(refused, timeout=30, hub=hub),
            lambda: aio.wait_for_result(refused, timeout=30, hub=hub),
        ),
        (
            reach.ResultTimeout,
            lambda: reach.wait_for_result(held, timeout=0.5, hub=hub),
            lambda: aio.wait_for_result(held, timeout=0.5, hub=hub),
        ),
        (
            reach.NoSuitableAgent,
            lambda: reach.send(agent_id="nobody", method="m", hub=hub),
            lambda: aio.send(agent_id="nobody", method="m", hub=hub),
        ),
        (
            reach.InvalidTaskRequest,
            lambda: reach.report_result("t-nowhere", hub=hub),  # names no attempt
            lambda: aio.report_result("t-nowhere", hub=hub),
        ),
        (
            reach.SemanticMatchingOff,  # this hub has no embedding model
            lambda: reach.find("say it back", hub=hub),
            lambda: aio.find("say it back", hub=hub),
        ),
        (
            reach.Unauthenticated,
            lambda: reach.get_task(held, hub=hub, api_key=SECRET),
            lambda: aio.get_task(held, hub=hub, api_key=SECRET),
        ),
        (
            reach.Forbidden,  # a valid key outside its scope
            lambda: reach.send(agent_id=AGENT, method="echo", hub=hub, api_key=viewer.secret),
            lambda: aio.send(agent_id=AGENT, method="echo", hub=hub, api_key=viewer.secret),
        ),
        (
            reach.HubUnavailable,
            lambda: reach.send(agent_id=AGENT, method="echo", hub=down, api_key=SECRET),
            lambda: aio.send(agent_id=AGENT, method="echo", hub=down, api_key=SECRET),
        ),
        (
            reach.HubUnavailable,
            lambda: reach.wait_for_result("t-1", timeout=1, hub=down),
            lambda: aio.wait_for_result("t-1", timeout=1, hub=down),
        ),
    ]
    for expected, sync_call, async_call in cases:
        with pytest.raises(expected) as sync_caught:
            sync_call()

        async def main(async_call: Callable[[], Awaitable[Any]] = async_call) -> Any:
            return await async_call()

        with pytest.raises(expected) as async_caught:
            run(main)
        assert type(async_caught.value) is type(sync_caught.value), expected
        if expected is not reach.HubUnavailable:  # the hub's own words, whichever client
            assert async_caught.value.detail == sync_caught.value.detail
            assert async_caught.value.extra == sync_caught.value.extra
        for shown in (str(async_caught.value), repr(async_caught.value.extra)):
            assert SECRET not in shown and viewer.secret not in shown
    business = run(lambda: _raised(aio.wait_for_result(refused, timeout=30, hub=hub)))
    assert isinstance(business, reach.BusinessError)
    assert (business.code, business.message) == (7, "out of stock")
    timeout = run(lambda: _raised(aio.wait_for_result(held, timeout=0.5, hub=hub)))
    assert isinstance(timeout, reach.ResultTimeout)
    assert timeout.extra["status"] == "executing"
    unavailable = run(lambda: _raised(aio.send(agent_id=AGENT, method="m", hub=down)))
    assert isinstance(unavailable, reach.HubUnavailable)
    assert f"hub at {down} is unreachable" in str(unavailable)


async def _raised(call: Awaitable[Any]) -> BaseException:
    try:
        await call
    except BaseException as exc:
        return exc
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"<html>Welcome to nginx!</html>", "text/html"), (b'{"ok": true}', "application/json")],
)
def test_a_2xx_without_the_hubs_json_is_a_protocol_error(body: bytes, content_type: str) -> None:
    fake = _NotAHub(body, content_type)
    try:
        calls = [
            lambda: aio.send(agent_id="a", method="m", hub=fake.url),
            lambda: aio.wait_for_result("t-1", timeout=1, hub=fake.url),
            lambda: aio.broadcast(capability="c", method="m", timeout=1, hub=fake.url),
            lambda: aio.open_session("s-1", hub=fake.url),
        ]
        for call in calls:
            error = run(lambda call=call: _raised(call()))
            assert isinstance(error, reach.ProtocolError), error
            assert error.extra["http_status"] == 200
    finally:
        fake.close()


def test_broadcast_gathers_every_target(shared_stack: Stack, agent: reach.Agent) -> None:
    async def main() -> reach.BroadcastResult:
        return await aio.broadcast(
            method="echo", tags=[TAG], payload={"word": "all"}, timeout=20, hub=shared_stack.url
        )

    # A broadcast goes to the instances routable at that moment: after the tests before
    # (a hundred sends at once fill the agent), its heartbeats must say it takes work again.
    wait_until(
        lambda: [i["status"] for i in shared_stack.instances(AGENT)] == ["online"],
        timeout=30,
        what=f"{AGENT} online and taking work",
    )
    try:
        result = run(main)
    except reach.NoSuitableAgent as exc:
        raise AssertionError(f"{exc}; the hub's view: {shared_stack.instances(AGENT)}") from exc
    assert isinstance(result, reach.BroadcastResult)
    assert (result.complete, result.succeeded) == (True, 1)
    assert result.data == [{"echo": "all", "session_alive": True}]
    assert [r["instance_id"] for r in result.results] == [agent.instance_id]


class CuttingProxy:
    """A TCP proxy to the hub that cuts its first connection as soon as it has passed on
    a progress event: a real drop in the middle of a stream."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests: list[bytes] = []  # each connection's first bytes (the request head)
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = not self.requests
        head = await reader.read(65536)
        self.requests.append(head)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        up_writer.write(head)
        try:
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
                if first and b"event: progress" in chunk:
                    break  # cut: both sides close below
        finally:
            up_writer.close()
            writer.close()


def test_a_stream_follows_progress_and_resumes_after_a_drop(
    shared_stack: Stack, agent: reach.Agent
) -> None:
    hub = shared_stack.url
    task_id = reach.send(agent_id=AGENT, method="hold", hub=hub).task_id
    wait_until(lambda: shared_stack.task(task_id)["status"] == "executing", 30, what="accepted")
    seq = agent.accepted_attempt(task_id)
    mine: dict[str, Any] = {"attempt_seq": seq, "instance_id": agent.instance_id, "hub": hub}
    proxy = CuttingProxy(int(hub.rsplit(":", 1)[1]))

    async def main() -> tuple[list[reach.StreamEvent], bool]:
        events: list[reach.StreamEvent] = []
        arrived = asyncio.Event()
        async with proxy as via:

            async def follow() -> None:
                async for event in aio.stream(task_id, hub=via, timeout=30):
                    events.append(event)
                    arrived.set()

            follower = asyncio.create_task(follow())
            await asyncio.wait_for(arrived.wait(), 20)  # the state: the stream is open
            await aio.report_progress(task_id, 0.5, "halfway", **mine)
            while len(proxy.requests) < 2:  # cut, and opened again
                await asyncio.sleep(0.05)
            await aio.report_progress(task_id, 1.0, "done", **mine)
            decided = await aio.report_result(task_id, {"done": True}, **mine)
            await asyncio.wait_for(follower, 20)
        return events, decided

    events, decided = run(main)
    assert decided is True
    assert [e.kind for e in events] == ["state", "progress", "progress", "result"], events
    assert [e.data["message"] for e in events if e.kind == "progress"] == ["halfway", "done"]
    assert events[-1].final and events[-1].data["result"] == {"done": True}
    ids = [e.id or 0 for e in events]
    assert ids == sorted(set(ids))  # each once, in order, over two connections
    assert len(proxy.requests) == 2
    assert b"last-event-id:" in proxy.requests[1].lower()
    # resuming from an id: only what came after it
    middle = events[1]
    rest = run(lambda: _collect(aio.stream(task_id, hub=hub, last_event_id=middle.id)))
    assert [e.id for e in rest] == ids[2:]
    missing = run(lambda: _raised(_collect(aio.stream("t-missing", hub=hub, timeout=10))))
    assert isinstance(missing, reach.UnknownTask)


async def _collect(events: Any) -> list[reach.StreamEvent]:
    return [event async for event in events]


def test_sessions_open_close_and_refuse_later_reaches(
    shared_stack: Stack, agent: reach.Agent
) -> None:
    hub = shared_stack.url
    sid = f"chat-{uuid.uuid4().hex[:12]}"
    other = f"chat-{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        opened = await aio.open_session(sid, ttl_s=600, hub=hub)
        assert opened["state"] == "open"
        view = await aio.get_session(sid, hub=hub)
        assert (view["state"], view["alive"]) == ("open", True)
        sub = await aio.send(
            agent_id=AGENT, method="echo", payload={"word": "in"}, session_id=sid, hub=hub
        )
        # generous: the module's hundred sends may still fill the agent on a loaded box
        result = await aio.wait_for_result(sub.task_id, timeout=90, hub=hub)
        assert result.data == {"echo": "in", "session_alive": True}
        assert result.task["session_id"] == sid
        closed = await aio.close_session(sid, reason="user left", hub=hub)
        assert closed["state"] == "closed"
        with pytest.raises(reach.SessionClosed):
            await aio.send(agent_id=AGENT, method="echo", session_id=sid, hub=hub)
        view = await aio.get_session(sid, hub=hub)
        assert (view["state"], view["alive"]) == ("closed", False)
        with pytest.raises(reach.UnknownSession):
            await aio.get_session(f"chat-{uuid.uuid4().hex}", hub=hub)
        # inside a handler: the task's session, from what this process heard or the hub
        assert await aio.session_alive(hub=hub) is True  # not handling: no session
        with trace.handling("t-1", None, AGENT, hub, session_id=sid):
            assert await aio.session_alive() is False  # closed by this process
        await aio.open_session(other, hub=hub)
        with trace.handling("t-2", None, AGENT, hub, session_id=other):
            assert await aio.session_alive() is True
        closing = requests.post(f"{hub}/v1/sessions/{other}/close", json={}, timeout=10)
        assert closing.ok, closing.text
        await asyncio.sleep(1.1)  # past the second a known answer is trusted
        with trace.handling("t-3", None, AGENT, hub, session_id=other):
            assert await aio.session_alive() is False  # asked the hub

    run(main)


def test_each_loop_gets_its_own_pool_closed_with_the_loop(hub_api: str) -> None:
    """Two ``asyncio.run`` in a row, then a pool closed early with ``aclose``: counted
    from the kernel's side, nothing outlives its loop, and the loops themselves go."""
    pools: list[Any] = []
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def calls() -> set[int]:
        pools.append(await loop_session())
        loops.append(weakref.ref(asyncio.get_running_loop()))
        with pytest.raises(reach.UnknownTask):
            await aio.get_task("t-nowhere", hub=hub_api)
        sids = [f"s-{uuid.uuid4().hex[:8]}" for _ in range(5)]
        await asyncio.gather(*(aio.open_session(s, hub=hub_api) for s in sids))
        assert open_pools() == 1
        return local_ports(hub_api)

    first = run(calls)
    assert first and local_ports(hub_api) == set()
    second = run(calls)
    assert second and local_ports(hub_api) == set()
    assert pools[0] is not pools[1] and all(p.closed for p in pools)
    assert open_pools() == 0
    pools.clear()
    gc.collect()
    assert [ref() for ref in loops] == [None, None]  # nothing holds a finished loop

    async def closed_early() -> None:
        await calls()
        session = await loop_session()
        await aio.aclose()
        assert session.closed and open_pools() == 0
        assert local_ports(hub_api) == set()
        await aio.open_session("s-after", hub=hub_api)  # a new pool, closed with the loop
        assert await loop_session() is not session

    run(closed_early)
    assert open_pools() == 0 and local_ports(hub_api) == set()
