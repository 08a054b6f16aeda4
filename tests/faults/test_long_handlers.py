"""A handler that takes longer than any timeout, on a hub with default settings.

A plain ``def`` handler thinks 90 s: longer than the task's default timeout (30 s),
the hub's watchdog grace (30 s) and the SDK's ``accept_after`` (10 s). It must end
``success`` with its result, its side effect run once, and no attempt dead-lettered or
re-run behind its back: the SDK answers 202 after ``accept_after``, keeps the task alive
with keepalives, and reports the result when the handler returns.

The hub is the embedded default (``reach up``'s: SQLite and its embedded broker), with
no setting changed; the agent counts deliveries over HTTP and handler runs in journals.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import reach
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.slow_agent import read_counts
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.parametrize("store_url", ["sqlite"], indirect=True),
    pytest.mark.timeout(300),
]

THINK_S = 90.0


@pytest.fixture
def default_stack(store_url: str, tmp_path: Path) -> Iterator[Stack]:
    stack = start_stack(store_url, tmp_path, {})  # nothing but the defaults
    try:
        yield stack
    finally:
        stop_stack(stack)


def test_a_90_second_handler_ends_success_once(default_stack: Stack, tmp_path: Path) -> None:
    stack = default_stack
    journal = tmp_path / "journal"
    with (tmp_path / "agent.out").open("wb") as out:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "tests.support.slow_agent", "--port", str(free_port()),
                "--hub", stack.url, "--journal", str(journal), "--agent-id", "thinker",
                "--delay", str(THINK_S), "--server", "builtin",
            ],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(
            lambda: any(i["status"] == "online" for i in stack.instances("thinker")),
            timeout=60,
            what="the agent online",
        )
        started = time.monotonic()
        sub = reach.send(agent_id="thinker", method="think", payload={"q": 42}, hub=stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=THINK_S + 60, hub=stack.url)
        took = time.monotonic() - started
        assert result.data["thought"] == {"q": 42}
        assert took >= THINK_S  # the handler's own answer, not a shortcut
        assert read_counts(journal, "runs.log") == {sub.task_id: 1}
        assert read_counts(journal, "deliveries.log") == {sub.task_id: 1}
        kinds = [e["kind"] for e in stack.events(sub.task_id)]
        assert kinds.count("dispatched") == 1, kinds
        assert "ack" in kinds  # answered 202, then reported
        assert not {"retry", "dead_letter", "republished", "watchdog"} & set(kinds), kinds
        assert result.attempt_seq == 1
    finally:
        processes.stop(agent)
