"""Session liveness (issue 14, point 6) through real processes (api, one worker process,
beat, a ``reach.Agent`` process) on SQLite and PostgreSQL, with authentication on.

Closing a session cancels its queued and parked reaches (``cancelled``, event
``session_closed``; the agent never receives them, counted at the agent over HTTP),
tells the in-flight one (the heartbeat answer's header; ``reach.session_alive()`` turns
False inside the handler), and refuses new reaches (``reach.SessionClosed``); a TTL
expiry refuses them too; another caller's key can neither read nor close the session.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import reach
from reach.core.gates.sessions import CLOSED_SESSIONS_HEADER, parse_closed
from reach.core.security.auth import Scope
from tests.support.ports import free_port
from tests.support.session_agent import SessionAgentProcess
from tests.support.stacks import Stack
from tests.support.trust_agents import PROBLEM, Key, api, make_key, reach_cli
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_APPROVAL__CAPABILITIES": '["policy.*"]',
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
STACK_WORKER_CONCURRENCY = 1
AGENT = "sessioned"


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key
    other: Key
    agent: Key


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        caller=make_key(shared_store_url, Scope.CALLER),
        other=make_key(shared_store_url, Scope.CALLER),
        agent=make_key(shared_store_url, Scope.AGENT, AGENT),
    )


@pytest.fixture(scope="module")
def agent(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionAgentProcess]:
    env = {k: v for k, v in shared_stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = keys.agent.secret
    log = tmp_path_factory.mktemp("agent") / "agent.out"
    # one task at a time at the agent: a held handler queues the rest in the hub, which
    # keeps them (claimed, not sent) until the agent has a place
    proc = SessionAgentProcess(
        shared_stack.url, free_port(), free_port(), log, "--max-concurrency", "1", env=env
    )
    try:
        wait_until(lambda: _online(shared_stack, keys.admin), 30, what="agent online")
        wait_until(lambda: _stats_up(proc), 10, what="agent stats")
        yield proc
    finally:
        proc.stop()


def _online(stack: Stack, admin: Key) -> bool:
    r = api(stack, "GET", f"/api/v1/agents/{AGENT}", admin)
    return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


def _stats_up(proc: SessionAgentProcess) -> bool:
    try:
        proc.stats()
    except Exception:
        return False
    return True


def _sid() -> str:
    return f"chat-{uuid.uuid4().hex[:12]}"


def _send(stack: Stack, key: Key, session_id: str, method: str = "work.do", **payload: Any) -> str:
    sub = reach.send(
        agent_id=AGENT,
        method=method,
        payload=payload,
        session_id=session_id,
        hub=stack.url,
        api_key=key.secret,
    )
    return sub.task_id


def _task(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    r = api(stack, "GET", f"/v1/tasks/{task_id}", key)
    assert r.ok, r.text
    return dict(r.json())


def _kinds(stack: Stack, key: Key, task_id: str) -> list[str]:
    r = api(stack, "GET", f"/v1/tasks/{task_id}/events", key)
    assert r.ok, r.text
    return [e["kind"] for e in r.json()["events"]]


def _heartbeat(stack: Stack, key: Key, instance_id: str) -> frozenset[str]:
    body = {"agent_id": AGENT, "instance_id": instance_id, "in_flight": 1}
    r = api(stack, "POST", "/v1/agents/heartbeat", key, body)
    assert r.ok, r.text
    return parse_closed(r.headers.get(CLOSED_SESSIONS_HEADER))


def test_close_cancels_queued_and_tells_in_flight(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    stack, sid = shared_stack, _sid()
    opened = reach.open_session(sid, hub=stack.url, api_key=keys.caller.secret)
    assert opened["state"] == "open" and opened["owner"] == keys.caller.identity
    held = _send(stack, keys.caller, sid, hold=25)
    wait_until(lambda: held in agent.stats()["received"], 20, what="the held task running")
    queued = [_send(stack, keys.caller, sid, n=n) for n in range(3)]
    time.sleep(0.5)  # the agent's one place is taken by the held task: these wait for it
    for task_id in queued:
        assert _task(stack, keys.caller, task_id)["status"] in ("pending", "dispatching")
    assert not set(queued) & set(agent.stats()["received"])
    instance_id = agent.stats()["instance_id"]
    assert sid not in _heartbeat(stack, keys.agent, instance_id)  # open: nothing to tell

    closed = reach.close_session(sid, "user left", hub=stack.url, api_key=keys.caller.secret)
    assert closed["state"] == "closed" and closed["alive"] is False
    # still in the queue: cancelled now; claimed and waiting in the hub for the agent's
    # place: in flight as far as the store can tell, and cancelled before they are sent
    assert set(closed["cancelled"]) <= set(queued)
    assert closed["in_flight"] == 1 + len(queued) - len(closed["cancelled"])
    assert closed["closed_by"] == keys.caller.identity

    # the in-flight one is told: on its instance's heartbeat answer, and inside its handler
    assert sid in _heartbeat(stack, keys.agent, instance_id)
    seen = wait_until(lambda: agent.stats()["observed"].get(held), 10, what="handler told")
    assert seen["closed_after_s"] < 25
    assert seen["nested"] == "SessionClosed"  # a reach from the handler inherits the session
    finished = wait_until(
        lambda: (t := _task(stack, keys.caller, held))["status"] == "success" and t,
        30,
        what="held task done",
    )
    assert finished["result"] == {"stopped": True}  # not killed: it stopped on its own

    for task_id in queued:
        # one waiting in the hub for the agent's place is looked at again when the place
        # frees (the held task's end), a moment after that end is recorded
        task = wait_until(
            lambda t=task_id: (v := _task(stack, keys.caller, t))["status"] != "dispatching" and v,
            20,
            what=f"{task_id} looked at again",
        )
        assert task["status"] == "cancelled"
        assert task["error"]["kind"] == "session_closed" and task["error"]["session_id"] == sid
        assert "session_closed" in _kinds(stack, keys.caller, task_id)
        with pytest.raises(reach.SessionClosed) as caught:
            reach.wait_for_result(task_id, timeout=5, hub=stack.url, api_key=keys.caller.secret)
        assert caught.value.extra["session_id"] == sid
        assert caught.value.extra["reason"] == "user left"

    # their broker messages were consumed after the held task: nothing reached the agent
    probe = _send(stack, keys.caller, _sid())
    reach.wait_for_result(probe, timeout=30, hub=stack.url, api_key=keys.caller.secret)
    received = agent.stats()["received"]
    assert held in received and probe in received
    assert not set(queued) & set(received)

    with pytest.raises(reach.SessionClosed) as refused:
        _send(stack, keys.caller, sid)
    assert refused.value.extra["session_id"] == sid
    view = reach.get_session(sid, hub=stack.url, api_key=keys.caller.secret)
    assert view["state"] == "closed" and view["reason"] == "user left"
    assert view["reaches"]["cancelled"] == 3 and view["reaches"]["live"] == 0
    with pytest.raises(reach.SessionClosed):  # closed is final
        reach.open_session(sid, hub=stack.url, api_key=keys.caller.secret)


def test_close_cancels_a_parked_reach_and_its_approval(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    stack, sid = shared_stack, _sid()
    parked = _send(stack, keys.caller, sid, method="policy.pay", amount=5)
    assert _task(stack, keys.caller, parked)["status"] == "awaiting_approval"
    closed = reach.close_session(sid, hub=stack.url, api_key=keys.caller.secret)
    assert closed["cancelled"] == [parked]
    assert _task(stack, keys.caller, parked)["status"] == "cancelled"
    r = api(stack, "GET", "/api/v1/approvals?all=true&limit=500", keys.admin)
    assert r.ok, r.text
    (approval,) = [a for a in r.json()["approvals"] if a["task_id"] == parked]
    assert approval["status"] == "cancelled"
    assert parked not in agent.stats()["received"]


def test_ttl_expiry_refuses_new_reaches(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    stack, sid = shared_stack, _sid()
    opened = reach.open_session(sid, ttl_s=2.0, hub=stack.url, api_key=keys.caller.secret)
    assert 0 < opened["ttl_remaining_s"] <= 2.0
    ok = _send(stack, keys.caller, sid)
    reach.wait_for_result(ok, timeout=30, hub=stack.url, api_key=keys.caller.secret)
    time.sleep(max(0.0, opened["expires_at"] - time.time()) + 0.3)
    with pytest.raises(reach.SessionClosed) as refused:
        _send(stack, keys.caller, sid)
    assert refused.value.extra["state"] == "expired"
    assert reach.get_session(sid, hub=stack.url, api_key=keys.caller.secret)["state"] == "expired"
    with pytest.raises(reach.SessionClosed):
        reach.open_session(sid, ttl_s=60, hub=stack.url, api_key=keys.caller.secret)


def test_reaches_queued_past_the_ttl_are_cancelled_at_claim(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    """Nobody closes it: the TTL runs out while reaches wait, the in-flight handler sees
    ``session_alive()`` turn False, and the worker cancels the waiting ones unsent."""
    stack, sid = shared_stack, _sid()
    reach.open_session(sid, ttl_s=3.0, hub=stack.url, api_key=keys.caller.secret)
    held = _send(stack, keys.caller, sid, hold=25)
    wait_until(lambda: held in agent.stats()["received"], 20, what="the held task running")
    queued = [_send(stack, keys.caller, sid, n=n) for n in range(2)]
    seen = wait_until(lambda: agent.stats()["observed"].get(held), 15, what="handler told")
    assert seen["closed_after_s"] < 10
    for task_id in queued:
        task = wait_until(
            lambda t=task_id: (v := _task(stack, keys.caller, t))["status"] == "cancelled" and v,
            30,
            what=f"{task_id} cancelled",
        )
        assert task["error"]["kind"] == "session_closed"
        assert "session_closed" in _kinds(stack, keys.caller, task_id)
        with pytest.raises(reach.SessionClosed):
            reach.wait_for_result(task_id, timeout=5, hub=stack.url, api_key=keys.caller.secret)
    assert not set(queued) & set(agent.stats()["received"])


def test_a_ttl_above_the_maximum_is_refused(shared_stack: Stack, keys: Keys) -> None:
    r = api(shared_stack, "POST", f"/v1/sessions/{_sid()}/open", keys.caller, {"ttl_s": 1e9})
    assert r.status_code == 422 and r.json()["type"] == PROBLEM + "invalid-task-request", r.text
    r = api(shared_stack, "POST", f"/v1/sessions/{_sid()}/open", keys.caller, {"ttl_s": -1})
    assert r.status_code == 422, r.text


def test_another_callers_key_cannot_read_or_close_my_session(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    stack, sid = shared_stack, _sid()
    reach.open_session(sid, hub=stack.url, api_key=keys.caller.secret)
    for method, path in (("GET", ""), ("POST", "/close"), ("POST", "/open")):
        r = api(
            stack, method, f"/v1/sessions/{sid}{path}", keys.other, {} if method == "POST" else None
        )
        assert r.status_code == 404, r.text
        assert r.json()["type"] == PROBLEM + "unknown-session"
    unknown = api(stack, "GET", f"/v1/sessions/{_sid()}", keys.other)
    assert unknown.status_code == 404 and unknown.json()["type"] == PROBLEM + "unknown-session"
    assert reach.get_session(sid, hub=stack.url, api_key=keys.caller.secret)["state"] == "open"
    reach.wait_for_result(_send(stack, keys.caller, sid), timeout=30, hub=stack.url,
                          api_key=keys.caller.secret)  # fmt: skip

    assert reach.get_session(sid, hub=stack.url, api_key=keys.admin.secret)["state"] == "open"
    closed = reach.close_session(sid, "moderation", hub=stack.url, api_key=keys.admin.secret)
    assert closed["closed_by"] == keys.admin.identity and closed["owner"] == keys.caller.identity
    with pytest.raises(reach.SessionClosed):
        _send(stack, keys.caller, sid)


def test_closing_an_unknown_session_records_it_closed(
    shared_stack: Stack, keys: Keys, agent: SessionAgentProcess
) -> None:
    stack, sid = shared_stack, _sid()
    closed = reach.close_session(sid, hub=stack.url, api_key=keys.caller.secret)
    assert closed["state"] == "closed" and closed["cancelled"] == []
    assert closed["owner"] == keys.caller.identity
    with pytest.raises(reach.SessionClosed):
        _send(stack, keys.caller, sid)
    with pytest.raises(reach.UnknownSession):  # it is the closer's: others see nothing
        reach.get_session(sid, hub=stack.url, api_key=keys.other.secret)


def test_cli_open_show_close(shared_stack: Stack, keys: Keys, agent: SessionAgentProcess) -> None:
    stack, sid = shared_stack, _sid()
    auth = ("--hub", stack.url, "--api-key", keys.caller.secret)
    opened = reach_cli(stack, "sessions", "open", sid, "--ttl", "600", *auth)
    assert opened.returncode == 0, opened.stderr
    assert f"session {sid}: open" in opened.stdout
    closed = reach_cli(stack, "sessions", "close", sid, "--reason", "done", *auth)
    assert closed.returncode == 0, closed.stderr
    assert "cancelled 0 reach(es)" in closed.stdout
    shown = reach_cli(stack, "sessions", "show", sid, *auth)
    assert shown.returncode == 0 and "closed" in shown.stdout and "done" in shown.stdout
    refused = reach_cli(stack, "sessions", "open", sid, *auth)
    assert refused.returncode == 1 and "SessionClosed" in refused.stderr
    missing = reach_cli(stack, "sessions", "show", sid, "--hub", stack.url,
                        "--api-key", keys.other.secret)  # fmt: skip
    assert missing.returncode == 1 and "UnknownSession" in missing.stderr


def test_unbound_sends_need_no_session(shared_stack: Stack, keys: Keys, agent: Any) -> None:
    """A session_id never opened is implicitly open (sends work as before)."""
    task_id = _send(shared_stack, keys.caller, _sid())
    reach.wait_for_result(task_id, timeout=30, hub=shared_stack.url, api_key=keys.caller.secret)
