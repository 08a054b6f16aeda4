"""The approval webhook through real processes (api, worker, beat, a counting agent whose
capability says ``require_approval``) on SQLite and PostgreSQL, and a real HTTP receiver
on loopback (``approval.webhook_allow_private``) that records every request.

Each approval request is POSTed once, signed by the hub (verified with
``reach.verify_webhook`` against the hub's JWKS; a forged or altered one is refused); a
receiver that is down at first gets it once it is back (backoff retries); a receiver that
hangs costs the submitting caller nothing (the POST runs in a worker); the SSRF screen
refuses the same loopback URL when private addresses are not allowed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import reach
from reach.core.notify.outbound import SIGNATURE_HEADER, Answer
from reach.hub.notify import approval_webhook
from reach.hub.security.sealing import SealKey
from reach.hub.security.signing import public_jwk
from reach.hub.settings import ApprovalSettings
from reach.hub.storage import create_engine_for, session_factory
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import WebhookReceiver

RECEIVER_PORT = free_port()
RECEIVER_URL = f"http://127.0.0.1:{RECEIVER_PORT}/hooks/approvals"
PUBLIC_URL = "https://hub.example.test"
STACK_SETTINGS = {
    "REACH_APPROVAL__WEBHOOK_URL": RECEIVER_URL,
    "REACH_APPROVAL__WEBHOOK_ALLOW_PRIVATE": "true",
    "REACH_APPROVAL__PUBLIC_URL": PUBLIC_URL,
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
AGENT = "wh-danger"
METHOD = "orders.cancel"


class Receiver(WebhookReceiver):
    """The shared loopback receiver, with this module's filter."""

    def for_approval(self, approval_id: str) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b in self.received() if json.loads(b)["approval_id"] == approval_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver(RECEIVER_PORT)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def agent(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CountingAgentProcess]:
    directory = tmp_path_factory.mktemp("wh-agent")
    proc = CountingAgentProcess(
        shared_stack.url, directory / "agent.journal", free_port(),
        "--agent-id", AGENT, "--method", METHOD, "--require-approval",
    )  # fmt: skip
    try:
        wait_until(lambda: shared_stack.instances(AGENT), 30, what="the agent registered")
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def stack(shared_stack: Stack, receiver: Receiver, agent: CountingAgentProcess) -> Stack:
    receiver.hang_s = 0.0
    return shared_stack


def park(stack: Stack, **payload: Any) -> tuple[str, dict[str, Any]]:
    """Submit a dangerous task; (its task id, its pending approval)."""
    r = requests.post(
        f"{stack.url}/v1/tasks",
        json={"agent_id": AGENT, "method": METHOD, "payload": payload or {"order": 1}},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    task_id = r.json()["task_id"]
    assert r.json()["status"] == "awaiting_approval", r.json()
    found = requests.get(f"{stack.url}/api/v1/approvals", timeout=5).json()["approvals"]
    (approval,) = [a for a in found if a["task_id"] == task_id]
    return task_id, dict(approval)


def test_each_request_is_posted_once_signed_by_the_hub(
    stack: Stack, receiver: Receiver, agent: CountingAgentProcess
) -> None:
    task_id, approval = park(stack, order="W-1")
    got = wait_until(lambda: receiver.for_approval(approval["approval_id"]), 20, what="the webhook")
    headers, body = got[0]
    assert headers["Content-Type"] == "application/json"
    verified = reach.verify_webhook(body, headers[SIGNATURE_HEADER], hub=stack.url)
    assert {k: verified[k] for k in approval if k in verified} == {
        k: approval[k] for k in approval if k in verified
    }
    assert verified["task_id"] == task_id and verified["capability"] == METHOD
    assert verified["agent_id"] == AGENT and verified["method"] == METHOD
    aid = approval["approval_id"]
    assert verified["links"] == {
        "approve_api": f"{PUBLIC_URL}/api/v1/approvals/{aid}/approve",
        "reject_api": f"{PUBLIC_URL}/api/v1/approvals/{aid}/reject",
        "dashboard": f"{PUBLIC_URL}/ui/approvals/{aid}",
    }
    jwks = requests.get(f"{stack.url}/.well-known/jwks.json", timeout=5).json()
    assert reach.verify_webhook(body, headers[SIGNATURE_HEADER], jwks) == verified

    # forged: the body altered, or signed by a key the hub never published under its kid
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(
            body.replace(task_id.encode(), b"t-forged"), headers[SIGNATURE_HEADER], jwks
        )
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(body[:-1] + b" }", headers[SIGNATURE_HEADER], jwks)
    forger = Ed25519PrivateKey.generate()
    pem = forger.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    kid = jwks["keys"][0]["kid"]
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(body, approval_webhook.sign(body, kid, pem), jwks)
    with pytest.raises(reach.InvalidSignature):  # its own kid: not in the hub's set
        reach.verify_webhook(
            body, approval_webhook.sign(body, public_jwk(forger)["kid"], pem), jwks
        )

    time.sleep(2.0)  # no duplicate trails behind it
    assert len(receiver.for_approval(aid)) == 1
    assert agent.counts().deliveries[task_id] == 0  # a webhook is not a delivery


def test_a_receiver_down_at_first_gets_the_request_once_it_is_back(
    stack: Stack, receiver: Receiver
) -> None:
    receiver.stop()
    try:
        _, approval = park(stack, order="W-down")
        time.sleep(2.5)  # the first attempt and a retry or two meet a closed port
        assert receiver.for_approval(approval["approval_id"]) == []
    finally:
        receiver.start()
    got = wait_until(
        lambda: receiver.for_approval(approval["approval_id"]), 30, what="the retried webhook"
    )
    headers, body = got[0]
    assert (
        reach.verify_webhook(body, headers[SIGNATURE_HEADER], hub=stack.url)["approval_id"]
        == (approval["approval_id"])
    )


def test_loopback_is_refused_unless_private_addresses_are_allowed(
    stack: Stack, receiver: Receiver, shared_store_url: str
) -> None:
    """The SSRF screen, on the real store and receiver: the worker's send path with
    ``webhook_allow_private`` off refuses the loopback URL and nothing reaches it."""
    _, approval = park(stack, order="W-ssrf")
    aid = approval["approval_id"]
    wait_until(lambda: receiver.for_approval(aid), 20, what="the allowed webhook")
    engine = create_engine_for(shared_store_url)
    try:
        sessions = session_factory(engine)
        seal = SealKey.load(None, stack.home)  # the hub's signing key is sealed with it
        strict = ApprovalSettings(webhook_url=RECEIVER_URL, public_url=PUBLIC_URL)
        sent = approval_webhook.deliver(sessions, strict, aid, time.time(), seal=seal)
        assert sent.answer is Answer.DROP and "loopback" in sent.detail, sent
        allowed = strict.model_copy(update={"webhook_allow_private": True})
        assert approval_webhook.deliver(sessions, allowed, aid, time.time(), seal=seal).answer is (
            Answer.DELIVERED
        )
        # decided: nothing left to ask, nothing sent
        r = requests.post(
            f"{stack.url}/api/v1/approvals/{aid}/reject", json={"reason": "test"}, timeout=10
        )
        assert r.status_code == 200, r.text
        before = len(receiver.for_approval(aid))
        dropped = approval_webhook.deliver(sessions, allowed, aid, time.time(), seal=seal)
        assert dropped.answer is Answer.DROP
        assert len(receiver.for_approval(aid)) == before == 2
    finally:
        engine.dispose()


def test_a_hanging_receiver_does_not_slow_the_submit(stack: Stack, receiver: Receiver) -> None:
    receiver.hang_s = 8.0  # longer than the hub's read timeout: the worker gives up on it
    took = []
    ids = []
    for i in range(3):
        start = time.monotonic()
        _, approval = park(stack, order=f"W-hang-{i}")
        took.append(time.monotonic() - start)
        ids.append(approval["approval_id"])
    assert max(took) < 1.5, took
    wait_until(lambda: all(receiver.for_approval(a) for a in ids), 30, what="the hung webhooks")
    # deciding is not held up either
    start = time.monotonic()
    r = requests.post(
        f"{stack.url}/api/v1/approvals/{ids[0]}/reject", json={"reason": "test"}, timeout=10
    )
    assert r.status_code == 200, r.text
    assert time.monotonic() - start < 1.5
    receiver.hang_s = 0.0
