"""Agents behind NAT on loopback: a channel agent process takes its tasks over the WebSocket
it opened, on both stores; every bad frame and bad credential is refused.

The agent (``tests/support/channel_agent.py``) serves no port; it journals every delivery
and handler run, which is how executions are counted at the agent. The refusals are
spoken by a raw ``websockets`` client the test drives itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

import reach
from tests.support import processes
from tests.support.channel_agent import read_journal
from tests.support.paths import REPO
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

# The channel tests share one hub per store; the key test below creates an API key, so it
# takes a hub of its own (the per-test ``stack``).


def start_channel_agent(
    hub: str, journal: Path, agent_id: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with journal.with_suffix(".out").open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.channel_agent",
                "--hub",
                hub,
                "--journal",
                str(journal),
                "--agent-id",
                agent_id,
                *extra,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def channel_instance(stack: Stack, agent_id: str) -> dict[str, Any] | None:
    found = stack.instances(agent_id)
    return found[0] if found else None


def ws_url(stack: Stack) -> str:
    return stack.url.replace("http://", "ws://") + "/v1/agents/channel"


def declaration(agent_id: str, instance_id: str | None = None) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "instance_id": instance_id or uuid.uuid4().hex,
        "addr": "http://127.0.0.1:9",
        "allow_loopback": True,
        "heartbeat_interval": 1.0,
    }


def refusal(conn: ClientConnection) -> tuple[dict[str, Any], int | None]:
    """The hub's error frame and the close code that follows it."""
    frame = json.loads(conn.recv(timeout=10))
    with pytest.raises(ConnectionClosed) as closed:
        conn.recv(timeout=10)
    rcvd = closed.value.rcvd
    return frame, rcvd.code if rcvd is not None else None


@pytest.fixture
def channel_agent(
    shared_stack: Stack, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    journal = tmp_path / "journal.log"
    proc = start_channel_agent(shared_stack.url, journal, "nat-loop")
    try:
        wait_until(
            lambda: (i := channel_instance(shared_stack, "nat-loop")) and i["status"] == "online",
            30,
            what="the channel agent registered",
        )
        yield proc, journal
    finally:
        processes.stop(proc)
        # the hub is shared: the next test's nat-loop must not find this one's instance
        wait_until(
            lambda: channel_instance(shared_stack, "nat-loop") is None,
            30,
            what="the channel agent deregistered",
        )


def test_channel_agent_takes_tasks_and_is_scored_from_the_channel(
    shared_stack: Stack, channel_agent: tuple[subprocess.Popen[bytes], Path]
) -> None:
    _, journal = channel_agent
    inst = channel_instance(shared_stack, "nat-loop")
    assert inst is not None
    assert "/internal/channel/" in inst["endpoint"]
    assert inst["endpoint"].endswith("/***"), "a fleet view must not show the socket secret"
    ids = [
        reach.send(
            agent_id="nat-loop", method="task.process", payload={"n": n}, hub=shared_stack.url
        ).task_id
        for n in range(6)
    ]
    for task_id in ids:
        result = reach.wait_for_result(task_id, timeout=30, hub=shared_stack.url)
        assert result.data["echo"]["n"] == ids.index(task_id), result
    deliveries, runs = read_journal(journal)
    assert all(runs[t] == 1 and deliveries[t] == 1 for t in ids), (deliveries, runs)
    # the channel's pings are the instance's probe evidence: RTT measured, nothing lost
    scored = wait_until(
        lambda: (
            (i := channel_instance(shared_stack, "nat-loop")) and i.get("rtt_ms") is not None and i
        ),
        15,
        what="an RTT from the channel's pings",
    )
    assert scored["probe_status"] == "ok"
    assert scored["loss_rate"] == 0.0


def test_internal_delivery_needs_the_sockets_secret(
    shared_stack: Stack, channel_agent: tuple[subprocess.Popen[bytes], Path]
) -> None:
    _, journal = channel_agent
    inst = channel_instance(shared_stack, "nat-loop")
    assert inst is not None
    iid = inst["instance_id"]
    body = {"task_id": "forged", "attempt_seq": 0, "method": "task.process", "payload": {}}
    r = requests.post(
        f"{shared_stack.url}/internal/channel/{iid}/not-the-secret/tasks/task.process",
        json=body,
        timeout=10,
    )
    assert r.status_code == 503
    assert "no open channel" in r.json()["message"]
    assert read_journal(journal) == ({}, {})


def test_frames_are_refused(shared_stack: Stack) -> None:
    # not JSON as the first frame: error frame, closed with policy violation
    with connect(ws_url(shared_stack), proxy=None) as conn:
        conn.send("{not json")
        frame, code = refusal(conn)
        assert (frame["type"], frame["code"], code) == ("error", "bad_frame", 1008)
    # a first frame that is not hello
    with connect(ws_url(shared_stack), proxy=None) as conn:
        conn.send(json.dumps({"type": "result", "task_id": "t", "attempt_seq": 1}))
        frame, code = refusal(conn)
        assert (frame["code"], code) == ("bad_frame", 1008)
    # an invalid declaration: nothing registered
    with connect(ws_url(shared_stack), proxy=None) as conn:
        conn.send(json.dumps({"type": "hello", "register": {"agent_id": "", "addr": "x"}}))
        frame, code = refusal(conn)
        assert (frame["code"], code) == ("invalid_registration", 1008)
    # a registered channel: a result for an attempt it does not hold is refused, and the
    # channel stays up; a malformed or oversize frame then closes it
    iid = uuid.uuid4().hex
    with connect(ws_url(shared_stack), proxy=None, max_size=None) as conn:
        conn.send(json.dumps({"type": "hello", "register": declaration("nat-raw", iid)}))
        welcome = json.loads(conn.recv(timeout=10))
        assert welcome["type"] == "welcome" and welcome["instance_id"] == iid
        conn.send(
            json.dumps(
                {
                    "type": "result",
                    "task_id": "never-delivered",
                    "attempt_seq": 3,
                    "status": 200,
                    "body": {"code": 0, "data": "forged"},
                }
            )
        )
        while (frame := json.loads(conn.recv(timeout=10)))["type"] == "ping":
            pass
        assert (frame["type"], frame["code"]) == ("error", "unknown_attempt")
        assert (frame["task_id"], frame["attempt_seq"]) == ("never-delivered", 3)
        conn.send(json.dumps({"type": "pong", "id": 1}))  # still open
        conn.send(json.dumps({"type": "ack", "task_id": "", "attempt_seq": 1}))
        while (frame := json.loads(conn.recv(timeout=10)))["type"] == "ping":
            pass
        assert frame["code"] == "bad_frame"
    with connect(ws_url(shared_stack), proxy=None, max_size=None) as conn:
        conn.send(json.dumps({"type": "hello", "register": declaration("nat-raw", iid)}))
        assert json.loads(conn.recv(timeout=10))["type"] == "welcome"
        conn.send(json.dumps({"type": "heartbeat", "heartbeat": {"pad": "x" * 3_000_000}}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                conn.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert shared_stack.task  # the hub is still serving
    assert requests.get(shared_stack.url + "/healthz", timeout=5).ok


def test_channel_with_another_agents_key_is_refused(stack: Stack) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reach",
            "keys",
            "create",
            "--scope",
            "agent",
            "--agent-id",
            "nat-mine",
            "--json",
        ],
        env=stack.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    secret = json.loads(done.stdout)["secret"]
    headers = {"Authorization": f"Bearer {secret}"}
    with connect(ws_url(stack), proxy=None, additional_headers=headers) as conn:
        conn.send(json.dumps({"type": "hello", "register": declaration("nat-theirs")}))
        frame, code = refusal(conn)
        assert (frame["code"], code) == ("forbidden", 1008)
        assert secret not in json.dumps(frame)
    with connect(
        ws_url(stack), proxy=None, additional_headers={"Authorization": "Bearer nope"}
    ) as conn:
        frame, code = refusal(conn)
        assert code == 1008 and frame["type"] == "error"
    assert channel_instance(stack, "nat-theirs") is None
    # the SDK turns the refusal into the typed error, at start
    agent = reach.Agent("nat-theirs", channel=True, hub=stack.url, api_key=secret)
    with pytest.raises(reach.Forbidden):
        agent.start()
    # its own agent ID is fine
    own = reach.Agent("nat-mine", hub=stack.url, api_key=secret, heartbeat_interval=1.0)
    assert own.channel
    own.start()
    try:
        inst = wait_until(lambda: channel_instance(stack, "nat-mine"), 10, what="registered")
        assert "/internal/channel/" in inst["endpoint"]
    finally:
        own.close()
