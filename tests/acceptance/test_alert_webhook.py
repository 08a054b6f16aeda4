"""The alert webhook through real processes (api, worker, beat) on PostgreSQL + Redis, a
recording agent killed so its tasks dead-letter, and a real HTTP receiver on loopback
(``alerts.webhook_allow_private``).

The beat's ``reach.alerts_push`` tick POSTs each dead letter's alert, signed by the hub
(verified with ``reach.verify_webhook``); a receiver down at first gets it once it is
back (backoff retries); a muted kind is not pushed and not listed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import reach
from reach.core.notify.outbound import SIGNATURE_HEADER
from tests.support.ports import free_port
from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import WebhookReceiver

RECEIVER_PORT = free_port()
RECEIVER_URL = f"http://127.0.0.1:{RECEIVER_PORT}/hooks/alerts"
STACK_SETTINGS = {
    "REACH_ALERTS__WEBHOOK_URL": RECEIVER_URL,
    "REACH_ALERTS__WEBHOOK_ALLOW_PRIVATE": "true",
    "REACH_ALERTS__PUSH_INTERVAL_S": "0.5",
    "REACH_ALERTS__BACKOFF_BASE_S": "0.5",
    "REACH_ALERTS__BACKOFF_CAP_S": "1",
    "REACH_ROUTER__MAX_RETRY": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "3",
}
AGENT = "alerting"


class Receiver(WebhookReceiver):
    """The shared loopback receiver, with this module's filter."""

    def for_task(self, task_id: str) -> list[tuple[dict[str, str], bytes]]:
        return [
            (h, b)
            for h, b in self.received()
            if json.loads(b).get("details", {}).get("task_id") == task_id
        ]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver(RECEIVER_PORT)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def dead_agent(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An agent that registered, then died: what is sent to it is dead-lettered."""
    log = tmp_path_factory.mktemp("agent") / "a.log"
    agent = AgentProcess(shared_stack.url, log, agent_id=AGENT)
    wait_until(
        lambda: any(i["status"] == "online" for i in shared_stack.instances(AGENT)),
        timeout=30,
        what=f"{AGENT} online",
    )
    agent.kill()
    return AGENT


@pytest.fixture
def stack(shared_stack: Stack, receiver: Receiver, dead_agent: str) -> Stack:
    return shared_stack


def dead_letter(stack: Stack, n: int) -> str:
    """Send a task to the dead agent; its id once it is dead-lettered."""
    task_id = reach.send(agent_id=AGENT, method="work.do", payload={"n": n}, hub=stack.url).task_id

    def dead() -> bool:
        rows = requests.get(f"{stack.url}/api/v1/dead-letters", timeout=5).json()["dead_letters"]
        return any(d["task_id"] == task_id for d in rows)

    wait_until(dead, timeout=60, what=f"{task_id} dead-lettered")
    return task_id


def test_a_dead_letter_reaches_the_receiver_signed_by_the_hub(
    stack: Stack, receiver: Receiver
) -> None:
    task_id = dead_letter(stack, 1)
    got = wait_until(lambda: receiver.for_task(task_id), 30, what="the alert webhook")
    headers, body = got[0]
    verified = reach.verify_webhook(body, headers[SIGNATURE_HEADER], hub=stack.url)
    assert verified["event"] == "alert" and verified["kind"] == "dead_letter"
    assert verified["agent_id"] == AGENT and verified["details"]["method"] == "work.do"
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(
            body.replace(task_id.encode(), b"t-forged"), headers[SIGNATURE_HEADER], hub=stack.url
        )
    time.sleep(2.0)  # no duplicate trails behind it
    assert len(receiver.for_task(task_id)) == 1


def test_a_receiver_down_at_first_gets_the_alert_once_it_is_back(
    stack: Stack, receiver: Receiver
) -> None:
    receiver.stop()
    try:
        task_id = dead_letter(stack, 2)
        time.sleep(2.5)  # ticks meet a closed port and back off
        assert receiver.for_task(task_id) == []
    finally:
        receiver.start()
    got = wait_until(lambda: receiver.for_task(task_id), 30, what="the retried alert")
    headers, body = got[0]
    assert reach.verify_webhook(body, headers[SIGNATURE_HEADER], hub=stack.url)["kind"] == (
        "dead_letter"
    )
    time.sleep(1.5)
    assert len(receiver.for_task(task_id)) == 1


def test_a_muted_kind_is_not_pushed_nor_listed(stack: Stack, receiver: Receiver) -> None:
    muted = requests.put(f"{stack.url}/api/v1/alerts/mutes/dead_letter", timeout=10)
    assert muted.status_code == 200, muted.text
    try:
        task_id = dead_letter(stack, 3)
        time.sleep(3.0)  # several ticks
        assert receiver.for_task(task_id) == []
        listed = requests.get(
            f"{stack.url}/api/v1/alerts", params={"kind": "dead_letter"}, timeout=10
        ).json()["items"]
        assert listed == []
        shown = requests.get(
            f"{stack.url}/api/v1/alerts",
            params={"kind": "dead_letter", "include_muted": "true"},
            timeout=10,
        ).json()["items"]
        assert [a["muted"] for a in shown if a["details"]["task_id"] == task_id] == [True]
        page = requests.get(f"{stack.url}/ui/alerts", params={"kind": "dead_letter"}, timeout=10)
        assert page.status_code == 200 and 'data-testid="muted-kinds"' in page.text
        assert task_id not in page.text
        page = requests.get(
            f"{stack.url}/ui/alerts",
            params={"kind": "dead_letter", "include_muted": "true"},
            timeout=10,
        )
        assert task_id in page.text and 'data-testid="alert-muted"' in page.text
    finally:
        requests.delete(f"{stack.url}/api/v1/alerts/mutes/dead_letter", timeout=10)
    time.sleep(1.5)  # passed over while muted: not sent once unmuted
    assert receiver.for_task(task_id) == []


def test_the_cli_mutes_and_unmutes(stack: Stack, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from reach.cli.commands import app

    runner = CliRunner()
    muted = runner.invoke(app, ["alerts", "mute", "backpressure", "--hub", stack.url])
    assert muted.exit_code == 0 and "backpressure: muted" in muted.output, muted.output
    listed = runner.invoke(app, ["alerts", "mutes", "--json", "--hub", stack.url])
    assert [m["kind"] for m in json.loads(listed.output)["mutes"]] == ["backpressure"]
    bare = runner.invoke(app, ["alerts", "-o", "json", "--include-muted", "--hub", stack.url])
    assert bare.exit_code == 0 and "items" in json.loads(bare.output), bare.output
    unmuted = runner.invoke(app, ["alerts", "unmute", "backpressure", "--hub", stack.url])
    assert unmuted.exit_code == 0 and "unmuted" in unmuted.output, unmuted.output
    unknown = runner.invoke(app, ["alerts", "mute", "nonsense", "--hub", stack.url])
    assert unknown.exit_code != 0
