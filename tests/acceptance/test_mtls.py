"""L1 trust end to end: `reach certs`, an agent served with tls=, delivery over mutual TLS.

Real processes on both stores: the hub (api, worker, beat), agents started from
tests/acceptance/agents/mtls_agent.py, the ``reach`` command line for certificates and
trust. Every run of an agent's handler is a line in its log, so "never ran" is counted
at the agent.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import urllib3

import reach
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_ROUTER__CANDIDATE_TTL": "0",  # a trust change routes at once
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_ROUTER__CONNECT_TIMEOUT": "1",
    "REACH_ROUTER__READ_TIMEOUT": "5",
}
SCRIPT = REPO / "tests" / "acceptance" / "agents" / "mtls_agent.py"


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach", *args],
        env={**stack.env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture
def hub_ca(stack: Stack) -> Path:
    """The hub's CA, made once per hub by ``reach certs init`` (later calls are refused)."""
    certs = stack.home / "certs"
    if not (certs / "ca.pem").exists():
        made = cli(stack, "certs", "init")
        assert made.returncode == 0, made.stderr
        assert str(certs / "ca.pem") in made.stdout and "PRIVATE KEY" not in made.stdout
    again = cli(stack, "certs", "init")
    assert again.returncode == 1 and "exists" in again.stderr
    return certs


def issue(stack: Stack, agent_id: str, out: Path, *extra: str) -> tuple[Path, Path]:
    issued = cli(stack, "certs", "issue", agent_id, "--out", str(out), *extra)
    assert issued.returncode == 0, issued.stderr
    assert "PRIVATE KEY" not in issued.stdout and "BEGIN" not in issued.stdout
    cert, key = out / f"{agent_id}.pem", out / f"{agent_id}.key"
    assert str(cert) in issued.stdout and str(key) in issued.stdout
    return cert, key


class MtlsAgent:
    def __init__(self, stack: Stack, agent_id: str, log: Path, *args: str) -> None:
        self.port = free_port()
        self.log = log
        self.url = f"127.0.0.1:{self.port}"
        with log.with_suffix(".out").open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--port", str(self.port), "--hub", stack.url,
                 "--agent-id", agent_id, "--log", str(log), *args],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def runs(self) -> list[str]:
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        processes.stop(self.proc)


@pytest.fixture
def agents() -> Iterator[list[MtlsAgent]]:
    started: list[MtlsAgent] = []
    yield started
    for agent in started:
        agent.stop()


def online(stack: Stack, agent_id: str) -> None:
    wait_until(
        lambda: any(i["status"] == "online" for i in stack.instances(agent_id)),
        timeout=30,
        what=f"an online instance of {agent_id}",
    )


def trust(stack: Stack, agent_id: str, level: str) -> None:
    done = cli(stack, "agents", "trust", agent_id, level, "--hub", stack.url)
    assert done.returncode == 0, done.stdout + done.stderr


def send(stack: Stack, agent_id: str, payload: dict[str, object]) -> str:
    sub = reach.send(agent_id=agent_id, method="pay.do", payload=payload, hub=stack.url)
    return sub.task_id


def test_a_task_reaches_an_l1_agent_over_mutual_tls(
    stack: Stack, hub_ca: Path, agents: list[MtlsAgent], tmp_path: Path
) -> None:
    cert, key = issue(stack, "payments", tmp_path, "--host", "127.0.0.1")
    agent = MtlsAgent(
        stack, "payments", tmp_path / "runs.log",
        "--cert", str(cert), "--key", str(key), "--ca", str(hub_ca / "ca.pem"),
    )  # fmt: skip
    agents.append(agent)
    online(stack, "payments")  # its probes (plain TCP + HTTP) are answered, heartbeats flow
    trust(stack, "payments", "L1")
    task_id = send(stack, "payments", {"amount": 5})
    result = reach.wait_for_result(task_id, timeout=30, hub=stack.url)
    assert result.data == {"paid": {"amount": 5}, "over": "https"}
    assert agent.runs() == [task_id]
    dispatched = [e for e in stack.events(task_id) if e["kind"] == "dispatched"]
    assert dispatched and dispatched[0]["detail"]["endpoint"].startswith("https://")

    # and nobody else gets through to it: not without the hub's certificate ...
    url = f"https://{agent.url}/tasks/pay.do"
    body = {"task_id": "intruder", "method": "pay.do", "payload": {}, "attempt_seq": 1}
    with warnings.catch_warnings(), pytest.raises(requests.exceptions.ConnectionError):
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        requests.post(url, json=body, verify=False, timeout=5)
    # ... nor with a client certificate of another CA
    other = tmp_path / "other-ca"
    made = cli(stack, "certs", "init", "--dir", str(other))
    assert made.returncode == 0, made.stderr
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(
            url,
            json=body,
            verify=str(hub_ca / "ca.pem"),
            cert=(str(other / "hub.pem"), str(other / "hub.key")),
            timeout=5,
        )
    # ... nor in plain HTTP (one status line, no handler)
    plain = requests.post(f"http://{agent.url}/tasks/pay.do", json=body, timeout=5)
    assert plain.status_code == 400
    assert agent.runs() == [task_id]


def test_the_hub_refuses_an_l1_agent_serving_another_cas_certificate(
    stack: Stack, hub_ca: Path, agents: list[MtlsAgent], tmp_path: Path
) -> None:
    other = tmp_path / "other-ca"
    assert cli(stack, "certs", "init", "--dir", str(other)).returncode == 0
    issued = cli(stack, "certs", "issue", "ledger", "--dir", str(other), "--out", str(tmp_path))
    assert issued.returncode == 0, issued.stderr
    # it trusts the hub's client certificate, so only the hub's own check can stop it
    agent = MtlsAgent(
        stack, "ledger", tmp_path / "runs.log",
        "--cert", str(tmp_path / "ledger.pem"), "--key", str(tmp_path / "ledger.key"),
        "--ca", str(hub_ca / "ca.pem"),
    )  # fmt: skip
    agents.append(agent)
    online(stack, "ledger")
    trust(stack, "ledger", "L1")
    task_id = send(stack, "ledger", {"amount": 7})
    with pytest.raises(reach.DeadLettered) as refused:
        reach.wait_for_result(task_id, timeout=30, hub=stack.url)
    assert refused.value.extra["cause"] == "tls"
    assert "failed mTLS verification" in str(refused.value)
    task = stack.task(task_id)
    assert task["status"] == "dead" and task["attempt_seq"] == 1  # terminal: no retries
    assert "retry" not in [e["kind"] for e in stack.events(task_id)]
    assert agent.runs() == []


def test_an_l1_agent_registered_at_http_is_never_contacted(
    stack: Stack, hub_ca: Path, agents: list[MtlsAgent], tmp_path: Path
) -> None:
    agent = MtlsAgent(stack, "legacy", tmp_path / "runs.log", "--scheme", "http")
    agents.append(agent)
    online(stack, "legacy")
    # as L2 it is reached over plain HTTP (so the agent itself works) ...
    first = send(stack, "legacy", {"n": 1})
    assert reach.wait_for_result(first, timeout=30, hub=stack.url).data["over"] == "http"
    assert agent.runs() == [first]
    # ... as L1, never: the attempt ends at once, before a connection opens
    trust(stack, "legacy", "L1")
    second = send(stack, "legacy", {"n": 2})
    with pytest.raises(reach.DeadLettered) as refused:
        reach.wait_for_result(second, timeout=30, hub=stack.url)
    assert "L1 agent requires https + mTLS" in str(refused.value)
    assert stack.task(second)["attempt_seq"] == 1
    assert agent.runs() == [first]
