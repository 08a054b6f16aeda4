"""``reach approvals`` against a hub of real processes that requires keys, on both stores:
a dangerous capability's task parks, a human decides from the command line, and the
caller's ``wait_for_result`` tells the outcome; deliveries are counted at the agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from tests.acceptance.test_sdk_credentials import Key, create_key, reach_cli
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
AGENT = "shop"
DANGEROUS = "orders.cancel"


class DangerAgent:
    """tests/acceptance/agents/danger_agent.py as its own process, with an agent key."""

    def __init__(self, hub: str, key: Key, directory: Path) -> None:
        self.port = free_port()
        self.out = directory / "danger-agent.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        env.update(REACH_API_KEY=key.secret, PYTHONUNBUFFERED="1")
        args = [
            sys.executable, "-m", "tests.acceptance.agents.danger_agent",
            "--port", str(self.port), "--hub", hub, "--agent-id", AGENT,
            "--journal", str(directory / "danger-agent.journal"),
        ]  # fmt: skip
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=out)

    def deliveries(self, task_id: str) -> int:
        """How many times the hub called the agent for ``task_id`` (asked over HTTP)."""
        counts = requests.get(f"http://127.0.0.1:{self.port}/counts", timeout=5).json()
        return int(counts["deliveries"].get(task_id, 0))

    def stop(self) -> None:
        processes.stop(self.proc)


class Keys:
    def __init__(self, stack: Stack) -> None:
        self.admin = create_key(stack.env, "admin", "--name", "ops")
        self.caller = create_key(stack.env, "caller", "--name", "checkout")
        self.approver = create_key(stack.env, "approver", "--name", "alice")
        self.agent = create_key(stack.env, "agent", "--agent-id", AGENT)


@pytest.fixture(scope="module")
def keys(shared_stack: Stack) -> Keys:
    return Keys(shared_stack)


@pytest.fixture(scope="module")
def agent(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DangerAgent]:
    started = DangerAgent(shared_stack.url, keys.agent, tmp_path_factory.mktemp("agent"))

    def online() -> bool:
        r = requests.get(
            f"{shared_stack.url}/api/v1/agents/{AGENT}",
            headers={"Authorization": f"Bearer {keys.admin.secret}"},
            timeout=5,
        )
        return r.ok and any(i["status"] == "online" for i in r.json().get("instances", []))

    try:
        wait_until(online, 30, what=f"{AGENT} online ({started.out.read_text()})")
        yield started
    finally:
        started.stop()


def cli(stack: Stack, key: Key | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``reach <args> --hub URL [--api-key SECRET]``."""
    auth = ["--api-key", key.secret] if key is not None else []
    return reach_cli(stack.env, *args, "--hub", stack.url, *auth)


def park(stack: Stack, keys: Keys, agent: DangerAgent) -> tuple[str, str]:
    """Send a dangerous task as the caller; return (task_id, approval_id) once it is parked."""
    task_id = f"cancel-{uuid.uuid4().hex[:12]}"
    sub = reach.send(
        agent_id=AGENT,
        method=DANGEROUS,
        payload={"order": 42},
        task_id=task_id,
        hub=stack.url,
        api_key=keys.caller.secret,
    )
    assert sub.status == "awaiting_approval"
    view = reach.get_task(task_id, hub=stack.url, api_key=keys.caller.secret)
    assert view["status"] == "awaiting_approval"
    pending = listed(stack, keys.approver)
    (approval,) = [a for a in pending if a["task_id"] == task_id]
    return task_id, str(approval["approval_id"])


def listed(stack: Stack, key: Key, *args: str) -> list[dict[str, Any]]:
    done = cli(stack, key, "approvals", "list", "--json", *args)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["approvals"])


def shown(stack: Stack, key: Key, approval_id: str) -> dict[str, Any]:
    done = cli(stack, key, "approvals", "show", approval_id, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_list_shows_the_parked_task_and_approve_delivers_it_once(
    shared_stack: Stack, keys: Keys, agent: DangerAgent
) -> None:
    task_id, approval_id = park(shared_stack, keys, agent)

    # parked: the wait runs out saying why, and the agent has not been called
    with pytest.raises(reach.ResultTimeout, match="still awaiting approval") as waited:
        reach.wait_for_result(task_id, 1.0, hub=shared_stack.url, api_key=keys.caller.secret)
    assert waited.value.extra["status"] == "awaiting_approval"
    assert agent.deliveries(task_id) == 0

    table = cli(shared_stack, keys.approver, "approvals", "list")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if approval_id in line)
    for cell in (task_id, DANGEROUS, AGENT, f"key:{keys.caller.key_id}", "pending"):
        assert cell in row, (cell, row)

    show = cli(shared_stack, keys.approver, "approvals", "show", approval_id)
    assert show.returncode == 0, show.stderr
    assert "payload sha256:" in show.stdout and "pending" in show.stdout

    task = cli(shared_stack, keys.caller, "tasks", "show", task_id)
    assert task.returncode == 0, task.stderr
    assert "awaiting_approval" in task.stdout
    assert f"approval {approval_id}  pending" in task.stdout

    approved = cli(shared_stack, keys.approver, "approvals", "approve", approval_id, "--name", "Al")
    assert approved.returncode == 0, approved.stderr
    assert f"approved {approval_id}: task {task_id} is on its way" in approved.stdout

    result = reach.wait_for_result(task_id, 30, hub=shared_stack.url, api_key=keys.caller.secret)
    assert result.data == {"task_id": task_id, "first": True}
    assert agent.deliveries(task_id) == 1

    decided = shown(shared_stack, keys.approver, approval_id)
    assert decided["status"] == "approved"
    assert decided["decided_by"] == f"key:{keys.approver.key_id}"
    assert decided["decided_name"] == "alice"  # the key's name, not --name
    assert approval_id not in {a["approval_id"] for a in listed(shared_stack, keys.approver)}
    everything = listed(shared_stack, keys.approver, "--all")
    assert approval_id in {a["approval_id"] for a in everything}
    after = cli(shared_stack, keys.caller, "tasks", "show", task_id)
    decided_by = f"approved  by key:{keys.approver.key_id} (alice)"
    assert f"approval {approval_id}  {decided_by}" in after.stdout

    # deciding again: refused with the problem's detail, nothing changes
    again = cli(shared_stack, keys.approver, "approvals", "approve", approval_id)
    assert again.returncode == 1, again.stdout + again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ApprovalDecided:"), again.stderr
    assert approval_id in lines[0]
    rejected_late = cli(
        shared_stack, keys.approver, "approvals", "reject", approval_id, "--reason", "late"
    )
    assert rejected_late.returncode == 1 and "ApprovalDecided" in rejected_late.stderr
    assert shown(shared_stack, keys.approver, approval_id)["status"] == "approved"
    assert agent.deliveries(task_id) == 1


def test_reject_with_a_reason_tells_the_caller_who_and_why(
    shared_stack: Stack, keys: Keys, agent: DangerAgent
) -> None:
    task_id, approval_id = park(shared_stack, keys, agent)
    done = cli(
        shared_stack,
        keys.approver,
        "approvals",
        "reject",
        approval_id,
        "--reason",
        "the customer wants to keep it",
        "--name",
        "Bob",
    )
    assert done.returncode == 0, done.stderr
    assert f"rejected {approval_id}: task {task_id} failed" in done.stdout

    with pytest.raises(reach.ApprovalRejected) as caught:
        reach.wait_for_result(task_id, 30, hub=shared_stack.url, api_key=keys.caller.secret)
    assert caught.value.extra["decided_by"] == f"key:{keys.approver.key_id}"
    assert caught.value.extra["reason"] == "the customer wants to keep it"
    assert "alice" in str(caught.value) and "the customer wants to keep it" in str(caught.value)

    decided = shown(shared_stack, keys.approver, approval_id)
    assert decided["status"] == "rejected" and decided["reason"] == "the customer wants to keep it"
    task = cli(shared_stack, keys.caller, "tasks", "show", task_id)
    assert "rejected" in task.stdout and "the customer wants to keep it" in task.stdout
    assert agent.deliveries(task_id) == 0  # never called: the hub had nothing to deliver


def test_reject_without_a_reason_exits_2_and_changes_nothing(
    shared_stack: Stack, keys: Keys, agent: DangerAgent
) -> None:
    task_id, approval_id = park(shared_stack, keys, agent)
    for extra in ([], ["--reason", ""], ["--reason", "   "]):
        done = cli(shared_stack, keys.approver, "approvals", "reject", approval_id, *extra)
        assert done.returncode == 2, (extra, done.stdout + done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "reject needs --reason" in lines[0], done.stderr
    assert shown(shared_stack, keys.approver, approval_id)["status"] == "pending"
    view = reach.get_task(task_id, hub=shared_stack.url, api_key=keys.caller.secret)
    assert view["status"] == "awaiting_approval"


def test_a_caller_key_cannot_decide_and_no_key_is_unauthenticated(
    shared_stack: Stack, keys: Keys, agent: DangerAgent
) -> None:
    task_id, approval_id = park(shared_stack, keys, agent)
    for key, error in ((keys.caller, "Forbidden:"), (None, "Unauthenticated:")):
        for args in (["approve", approval_id], ["reject", approval_id, "--reason", "no"]):
            done = cli(shared_stack, key, "approvals", *args)
            assert done.returncode == 1, (args, done.stdout + done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(error), done.stderr
    refused = cli(shared_stack, keys.caller, "approvals", "list")
    assert refused.returncode == 1 and refused.stderr.startswith("Forbidden:")
    assert shown(shared_stack, keys.approver, approval_id)["status"] == "pending"
    assert agent.deliveries(task_id) == 0


def test_an_unknown_approval_exits_1_and_a_bad_status_exits_2(
    shared_stack: Stack, keys: Keys
) -> None:
    for args in (["show", "ap-nope"], ["approve", "ap-nope"]):
        done = cli(shared_stack, keys.approver, "approvals", *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.startswith("UnknownApproval:") and "ap-nope" in done.stderr
    bad = cli(shared_stack, keys.approver, "approvals", "list", "--status", "maybe")
    assert bad.returncode == 2 and "maybe" in bad.stderr
