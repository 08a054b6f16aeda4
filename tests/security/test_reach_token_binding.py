"""Issue 37, item 5: a reach token is bound to the request it rides on.

A token captured on its way (a log, a proxy, a second instance of the same agent, whose
seen-``jti`` cache is its own) used to be good for any payload and any method of its
agent, and a body without ``attempt_seq`` skipped the attempt check. The hub now signs
the method and the sha256 of the body's exact bytes into the claims, and the SDK agent
checks both against the delivery it got, and requires ``attempt_seq``.

Real processes: a hub with auth on (api, worker, beat) and two instances of one SDK agent
(``tests/acceptance/agents/token_agent.py``) that verify tokens. The token is one the hub
really delivered to the first instance; the attacker presents it to the second.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests

from reach.core.security.tokens import body_digest
from tests.acceptance.test_reach_tokens import Hub, TokenAgent, create_key
from tests.support.reach_tokens import bearer, encoded, mint
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
AGENT = "tk-bound"


@pytest.fixture(scope="module")
def hub(shared_stack: Stack) -> Hub:
    return Hub(
        shared_stack, create_key(shared_stack.env, "admin"), create_key(shared_stack.env, "caller")
    )


@pytest.fixture(scope="module")
def pair(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TokenAgent]]:
    """Two instances of one agent, each a process with its own seen-jti cache."""
    directory = tmp_path_factory.mktemp("bound")
    agents = [hub.agent(AGENT, directory)]
    try:
        agents.append(hub.agent(AGENT, directory))
        wait_until(lambda: both_up(hub, agents), timeout=30, what="both instances online")
        yield agents
    finally:
        for agent in agents:
            agent.stop()


def both_up(hub: Hub, agents: list[TokenAgent]) -> bool:
    r = requests.get(f"{hub.stack.url}/api/v1/agents/{AGENT}", headers=hub.admin.headers, timeout=5)
    online = [i for i in r.json().get("instances", []) if i["status"] == "online"]
    try:
        for agent in agents:
            agent.counts()
    except requests.ConnectionError:
        return False
    return len(online) == 2


def captured(hub: Hub, pair: list[TokenAgent], payload: dict[str, Any]) -> tuple[str, TokenAgent]:
    """A task the hub really delivered: its token, and the instance that did NOT get it."""
    r = requests.post(
        f"{hub.stack.url}/v1/tasks",
        params={"wait": 30},
        json={"agent_id": AGENT, "method": "work.do", "payload": payload},
        headers=hub.caller.headers,
        timeout=40,
    )
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["status"] == "success", view
    task_id = view["task_id"]
    got = [a for a in pair if a.tokens(task_id)]
    assert len(got) == 1, "one instance took the delivery"
    other = next(a for a in pair if a is not got[0])
    return got[0].tokens(task_id)[0], other


def post(agent: TokenAgent, method: str, raw: bytes, token: str) -> requests.Response:
    return requests.post(
        f"{agent.url}/tasks/{method}",
        data=raw,
        headers={"Content-Type": "application/json", **bearer(token)},
        timeout=10,
    )


def test_the_hub_signs_the_method_and_the_digest_of_the_body_it_posts(
    hub: Hub, pair: list[TokenAgent]
) -> None:
    token, _ = captured(hub, pair, {"amount": 5})
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["method"] == "work.do"
    assert isinstance(claims["body_sha256"], str) and len(claims["body_sha256"]) == 64


def test_a_captured_token_with_another_payload_is_refused(hub: Hub, pair: list[TokenAgent]) -> None:
    token, other = captured(hub, pair, {"amount": 5, "to": "alice"})
    task_id = str(jwt.decode(token, options={"verify_signature": False})["task_id"])
    forged = encoded(
        {
            "task_id": task_id,
            "method": "work.do",
            "payload": {"amount": 5_000_000, "to": "mallory"},
            "attempt_seq": 1,
        }
    )
    r = post(other, "work.do", forged, token)
    assert r.status_code == 401, r.text
    assert r.json() == {
        "code": 401,
        "message": "token was signed for another body: the delivery's payload or fields differ",
    }
    assert other.runs(task_id) == 0
    assert other.counts()["refused"][task_id] == [401]


def test_a_captured_token_on_another_method_is_refused(hub: Hub, pair: list[TokenAgent]) -> None:
    token, other = captured(hub, pair, {"amount": 7})
    claims = jwt.decode(token, options={"verify_signature": False})
    # the very body is not known to the attacker byte for byte; the method alone is enough
    # to refuse, checked before the body
    raw = encoded({"task_id": claims["task_id"], "payload": {"amount": 7}, "attempt_seq": 1})
    r = post(other, "pay", raw, token)
    assert r.status_code == 401, r.text
    assert r.json()["message"] == "token is for another method"
    assert other.runs(str(claims["task_id"])) == 0


def test_a_body_without_attempt_seq_is_refused(hub: Hub, pair: list[TokenAgent]) -> None:
    """Even under a token the hub signed for exactly that body and method."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    raw = encoded({"task_id": task_id, "method": "work.do", "payload": {"n": 1}})
    token = mint(hub.store, audience=AGENT, task_id=task_id, body=raw)
    r = post(pair[1], "work.do", raw, token)
    assert r.status_code == 401, r.text
    assert "names no attempt_seq" in r.json()["message"]
    assert pair[1].runs(task_id) == 0


def test_the_exact_bytes_are_bound_not_their_meaning(hub: Hub, pair: list[TokenAgent]) -> None:
    """The same JSON with other whitespace is another body: the agent hashes what it got."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    body = {"task_id": task_id, "method": "work.do", "payload": {"n": 1}, "attempt_seq": 1}
    raw = encoded(body)
    token = mint(hub.store, audience=AGENT, task_id=task_id, body=raw)
    spaced = json.dumps(body).encode()
    assert body_digest(spaced) != body_digest(raw)
    assert post(pair[1], "work.do", spaced, token).status_code == 401
    ok = post(pair[1], "work.do", raw, token)  # a refusal spends nothing: the jti is fresh
    assert (ok.status_code, ok.json()["data"]["echo"]) == (200, {"n": 1})


def test_refused_replays_never_write_the_token_into_the_logs(
    hub: Hub, pair: list[TokenAgent], tmp_path: Path
) -> None:
    token, other = captured(hub, pair, {"amount": 9})
    raw = encoded({"task_id": "t-x", "payload": {}, "attempt_seq": 1})
    assert post(other, "work.do", raw, token).status_code == 401
    signature = token.rsplit(".", 1)[1]
    for log in [*(a.output for a in pair), *(p.log_path for p in hub.stack.procs)]:
        assert signature not in log.read_text(errors="replace"), log
