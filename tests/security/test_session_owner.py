"""Issue 37, item 6: a session belongs to the key that opened it.

Caller B could close a session that only caller A's reaches named (A never opened it):
A's pending and parked reaches were cancelled and every later send of A's got 410. A
session now belongs to the key that opened it, or whose reach first named it: another
caller key can neither open, close nor bind reaches to it (close and open answer it as
unknown, a send is ``forbidden``), while an agent handling one of its reaches still
binds its onward reaches to it.

Real processes: a hub with auth on (api, worker, beat), two caller keys, and SDK agents
(``tests/acceptance/agents/token_agent.py``): an echo agent and one that forwards each
delivery through the hub from inside its handler (its reach inherits the session).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.acceptance.test_reach_tokens import Hub, Key, create_key
from tests.support.stacks import Stack

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
ECHO, FORWARDER = "so-echo", "so-forward"


@pytest.fixture(scope="module")
def hub(shared_stack: Stack) -> Hub:
    return Hub(
        shared_stack, create_key(shared_stack.env, "admin"), create_key(shared_stack.env, "caller")
    )


@pytest.fixture(scope="module")
def mallory(hub: Hub) -> Key:
    """A second caller key: B."""
    return create_key(hub.stack.env, "caller")


@pytest.fixture(scope="module")
def agents(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    directory = tmp_path_factory.mktemp("owner")
    echo = hub.agent(ECHO, directory)
    try:
        forwarder = hub.agent(FORWARDER, directory, "--mode", "forward", "--forward-to", ECHO)
        try:
            yield
        finally:
            forwarder.stop()
    finally:
        echo.stop()


def send(hub: Hub, key: Key, session_id: str, agent_id: str = ECHO) -> requests.Response:
    return requests.post(
        f"{hub.stack.url}/v1/tasks",
        params={"wait": 30},
        json={
            "agent_id": agent_id,
            "method": "work.do",
            "payload": {"n": 1},
            "session_id": session_id,
        },
        headers=key.headers,
        timeout=40,
    )


def session_call(hub: Hub, key: Key, session_id: str, verb: str) -> requests.Response:
    body: dict[str, Any] = {"reason": "mine now"} if verb == "close" else {}
    return requests.post(
        f"{hub.stack.url}/v1/sessions/{session_id}/{verb}", json=body, headers=key.headers,
        timeout=10,
    )  # fmt: skip


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def test_another_caller_cannot_close_a_session_only_my_reaches_named(
    hub: Hub, mallory: Key, agents: None
) -> None:
    sid = new_session()
    first = send(hub, hub.caller, sid)  # A never opens it: the reach names it
    assert first.status_code == 201 and first.json()["status"] == "success", first.text
    closed = session_call(hub, mallory, sid, "close")
    assert closed.status_code == 404, closed.text
    assert closed.headers["content-type"].startswith("application/problem+json")
    assert closed.json()["type"].endswith("unknown-session")
    # A's session is untouched: A's next reach goes through, and A still closes it
    again = send(hub, hub.caller, sid)
    assert again.status_code == 201 and again.json()["status"] == "success", again.text
    mine = session_call(hub, hub.caller, sid, "close")
    assert mine.status_code == 200, mine.text
    assert mine.json()["closed_by"] == f"key:{hub.caller.key_id}"
    assert mine.json()["owner"] == f"key:{hub.caller.key_id}"


def test_another_caller_cannot_open_or_use_my_session(hub: Hub, mallory: Key, agents: None) -> None:
    sid = new_session()
    opened = session_call(hub, hub.caller, sid, "open")
    assert opened.status_code == 201, opened.text
    stolen = session_call(hub, mallory, sid, "open")
    assert stolen.status_code == 404, stolen.text
    slipped = send(hub, mallory, sid)
    assert slipped.status_code == 403, slipped.text
    problem = slipped.json()
    assert problem["type"].endswith(":forbidden")
    assert "belongs to another key" in problem["detail"]
    # nothing of B's was bound to A's session
    view = requests.get(
        f"{hub.stack.url}/v1/sessions/{sid}", headers=hub.caller.headers, timeout=10
    ).json()
    assert view["reaches"]["by_status"] == {}
    # B cannot read it either
    peek = requests.get(f"{hub.stack.url}/v1/sessions/{sid}", headers=mallory.headers, timeout=10)
    assert peek.status_code == 404


def test_a_session_first_named_by_another_caller_is_theirs(
    hub: Hub, mallory: Key, agents: None
) -> None:
    """First use claims it: B's reach named it first, so A's reach is refused, clearly."""
    sid = new_session()
    assert send(hub, mallory, sid).status_code == 201
    mine = send(hub, hub.caller, sid)
    assert mine.status_code == 403, mine.text
    assert session_call(hub, hub.caller, sid, "close").status_code == 404


def test_an_agent_handling_a_reach_of_the_session_binds_its_onward_reach(
    hub: Hub, agents: None
) -> None:
    """The forwarder's handler reaches on with its own key; the reach inherits A's session."""
    sid = new_session()
    r = send(hub, hub.caller, sid, FORWARDER)
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["status"] == "success", view
    inner = requests.get(
        f"{hub.stack.url}/v1/tasks/{view['result']['inner_task_id']}",
        headers=hub.admin.headers,
        timeout=10,
    ).json()
    assert inner["session_id"] == sid and inner["status"] == "success", inner
    # yet that agent's key, not handling anything of the session now, may not bind to it
    key = hub.agent_key(FORWARDER)
    late = send(hub, key, sid)
    assert late.status_code == 403, late.text


def test_an_admin_may_close_any_session(hub: Hub, agents: None) -> None:
    sid = new_session()
    assert send(hub, hub.caller, sid).status_code == 201
    r = session_call(hub, hub.admin, sid, "close")
    assert r.status_code == 200, r.text
    assert send(hub, hub.caller, sid).status_code == 410
