"""examples/agents/async_langgraph.py as real processes behind a real hub: its async
LangGraph graph reaches the helper agent through the hub with ``reach.aio`` and answers
with what the helper said, and the hub recorded each reach.

Two ways to run it, as its docstring says: the helper as a process of its own (a plain
``def`` handler on the SDK's server) and the graph as another; or both in one process
(``--start-helper``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

EXAMPLE = REPO / "examples" / "agents" / "async_langgraph.py"
HELPER_ID = "order-desk-01"
TICKETS = ["Where is my order A-1001?", "Order B-9999 never came", "Hello, a question"]


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub per store."""
    return shared_stack


def online(stack: Stack) -> list[dict[str, Any]]:
    return [i for i in stack.instances(HELPER_ID) if i["status"] == "online"]


@pytest.fixture
def helper(stack: Stack, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "helper.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--serve-helper",
                "--port",
                str(free_port()),
                "--hub",
                stack.url,
                "--heartbeat-interval",
                "0.5",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the helper exited {proc.returncode}:\n{log.read_text()}")
            return bool(online(stack))

        wait_until(up, timeout=60, what=f"{HELPER_ID} online")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_graph(stack: Stack, *extra: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--hub", stack.url, *extra, *TICKETS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Unclosed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def check_answers(stack: Stack, answers: list[dict[str, Any]], instance_id: str) -> None:
    shipped, unknown, no_order = answers
    assert [a["ticket"] for a in answers] == TICKETS
    # the other agent's answer, through the hub, in the graph's output
    assert shipped["order"] == {
        "order_id": "A-1001",
        "status": "shipped",
        "carrier": "DHL",
        "eta_days": 2,
    }
    assert shipped["reach"]["agent_id"] == HELPER_ID
    assert shipped["reply"] == "Order A-1001 is shipped: expect it in 2 days."
    assert shipped["path"] == ["read", "lookup", "reply"]
    # its typed refusal, answered as such
    assert unknown["order"] == {
        "order_id": "B-9999",
        "status": "unknown",
        "detail": "no order B-9999",
    }
    assert unknown["reply"].startswith("We could not find order B-9999")
    # no order number: no reach
    assert no_order["order_id"] is None and no_order["reach"] is None
    assert no_order["path"] == ["read", "reply"]

    # the hub recorded both reaches: who answered, what, and the trail
    task = stack.task(shipped["reach"]["task_id"])
    assert (task["status"], task["agent_id"], task["instance_id"]) == (
        "success",
        HELPER_ID,
        instance_id,
    )
    assert task["method"] == "order.lookup" and task["result"] == shipped["order"]
    assert [e["kind"] for e in stack.events(task["task_id"])][-1] == "terminal_success"
    refused = stack.task(unknown["reach"]["task_id"])
    assert refused["status"] == "failed" and refused["error"]["code"] == 404


def test_the_graph_reaches_the_helper_process_through_the_hub(
    stack: Stack, helper: subprocess.Popen[bytes]
) -> None:
    (instance,) = online(stack)
    check_answers(stack, run_graph(stack), instance["instance_id"])


def test_one_process_starts_the_helper_for_the_run(stack: Stack) -> None:
    assert not online(stack)  # the helper process of the other test is gone
    answers = run_graph(stack, "--start-helper", str(free_port()), "--heartbeat-interval", "0.5")
    instance_id = stack.task(answers[0]["reach"]["task_id"])["instance_id"]
    check_answers(stack, answers, instance_id)
    assert not online(stack)  # it left the hub on its way out
