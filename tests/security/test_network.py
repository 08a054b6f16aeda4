"""Issue 37, item 2: which addresses the hub will call (SSRF).

The hub judges the addresses a name resolves to, not its spelling: at registration (a real
``reach api`` with auth on), before each probe and at every connection a delivery opens
(the hub's own transport and prober against real listeners on 127.0.0.1). An agent key's
``allow_loopback`` alone never lets a loopback agent in; link-local addresses are never
called; private ones only in the networks the operator declares. Redirects are never
followed, and an agent's raw answer never becomes the caller's error.

Traffic stays on this machine: the hubs here that have a worker and beat see only
127.0.0.1 agents; the non-loopback addresses are registered with API-only hubs, whose
refusals are the point (nothing there probes or delivers).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy.orm import Session

from reach.core.security.auth import Scope
from reach.core.security.networks import NetworkRule
from reach.hub.delivery.transports import AgentHttp
from reach.hub.fleet.probing import ProbeTarget, probe_once
from reach.hub.security import apikeys
from reach.hub.security.apikeys import CreatedKey
from reach.hub.storage import create_engine_for
from tests.support.a2a_echo import A2aEchoProcess
from tests.support.listeners import SlowHttpListener, closed_port
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, hub_env, start_stack, stop_stack, wait_http_ok
from tests.support.waiting import wait_until

PROBLEM = "urn:agent-reach:problem:"
_TEXTUAL_LOOPBACK = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def hosts_file_loopback_name() -> str | None:
    """A name of /etc/hosts that resolves to loopback and is no spelling of it (``vm``,
    the machine's own name ...), or None on a machine without one."""
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2 or not fields[0].startswith("127."):
            continue
        for name in fields[1:]:
            if name.lower() in _TEXTUAL_LOOPBACK or name.lower().endswith(".localhost"):
                continue
            try:
                found = {i[4][0] for i in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
            except OSError:
                continue
            if found and all(a.startswith("127.") for a in found):
                return name
    return None


# -- registration, on a hub that requires API keys ---------------------------------------


class StrictHub:
    def __init__(self, url: str, agent: CreatedKey, caller: CreatedKey) -> None:
        self.url, self.agent, self.caller = url, agent, caller

    def register(self, addr: str, allow_loopback: bool = False, **extra: Any) -> requests.Response:
        body = {
            "agent_id": f"net-{time.monotonic_ns()}",
            "addr": addr,
            "allow_loopback": allow_loopback,
            "capabilities": [{"type": "m"}],
            **extra,
        }
        return requests.post(
            f"{self.url}/v1/agents/register",
            json=body,
            headers={"Authorization": f"Bearer {self.agent.secret}"},
            timeout=30,
        )


def _key(url: str, scope: Scope, pattern: str | None = None) -> CreatedKey:
    engine = create_engine_for(url)
    try:
        with Session(engine) as session, session.begin():
            return apikeys.create_key(
                session,
                scope=scope,
                agent_pattern=pattern,
                name="net",
                expires_in_s=None,
                now=time.time(),
            )
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def strict_hub(
    shared_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StrictHub]:
    """``reach api`` alone (no worker, no beat: nothing is probed or delivered), auth on,
    loopback agents not allowed by the operator, one private network declared."""
    home = tmp_path_factory.mktemp("strict")
    env = hub_env(
        shared_store_url,
        home,
        REACH_SECURITY__REQUIRE_AUTH="true",
        REACH_SECURITY__ALLOW_LOOPBACK_AGENTS="false",
        REACH_SECURITY__AGENT_NETWORKS='["10.20.0.0/16"]',
    )
    port = free_port()
    proc = HubProcess(["api", "--port", str(port)], env, home / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", proc)
        yield StrictHub(
            url, _key(shared_store_url, Scope.AGENT, "*"), _key(shared_store_url, Scope.CALLER)
        )
    finally:
        proc.stop()


def _refused(answer: requests.Response, slug: str) -> dict[str, Any]:
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = dict(answer.json())
    assert problem["type"] == PROBLEM + slug, problem
    return problem


def test_a_hosts_file_name_that_points_at_loopback_is_refused(strict_hub: StrictHub) -> None:
    name = hosts_file_loopback_name()
    if name is None:
        pytest.skip("no /etc/hosts name resolves to loopback on this machine")
    problem = _refused(strict_hub.register(f"{name}:{free_port()}"), "loopback-address")
    assert "security.allow_loopback_agents" in problem["detail"]
    assert problem["field"] == "addr"
    # public_endpoint is the address the hub calls: judged the same way
    behind = strict_hub.register("10.20.0.7:7001", public_endpoint=f"http://{name}:{free_port()}")
    assert _refused(behind, "loopback-address")["field"] == "public_endpoint"


def test_an_agent_keys_allow_loopback_alone_is_refused(strict_hub: StrictHub) -> None:
    for addr in ("127.0.0.1:7001", "[::1]:7001", "localhost:7001", "127.1:7001"):
        problem = _refused(strict_hub.register(addr, allow_loopback=True), "loopback-address")
        assert "allow_loopback_agents" in problem["detail"]


def test_link_local_and_undeclared_private_addresses_are_refused(strict_hub: StrictHub) -> None:
    for addr in ("169.254.169.254:80", "[fe80::1]:80", "[::ffff:169.254.169.254]:80"):
        assert "link-local" in _refused(strict_hub.register(addr), "address-refused")["detail"]
    for addr in ("10.0.0.5:7001", "192.168.1.5:7001", "100.64.0.9:7001", "192.0.0.8:7001"):
        problem = _refused(strict_hub.register(addr), "address-refused")
        assert "security.agent_networks" in problem["detail"]
    unresolved = _refused(strict_hub.register("no-such-host.invalid:7001"), "address-refused")
    assert "does not resolve" in unresolved["detail"]
    # the operator's declared network is the normal production case
    assert strict_hub.register("10.20.3.4:7001").status_code == 201


def test_callback_urls_are_judged_by_the_same_classification(strict_hub: StrictHub) -> None:
    """100.64.0.0/10 (shared) and 192.0.0.8 were let through by a hand list."""
    agent = strict_hub.register("10.20.3.5:7001")
    assert agent.status_code == 201, agent.text
    for url in ("http://100.64.0.1/cb", "http://192.0.0.8/cb", "http://169.254.169.254/cb"):
        answer = requests.post(
            f"{strict_hub.url}/v1/tasks",
            json={"agent_id": agent.json()["agent_id"], "method": "m", "callback_url": url},
            headers={"Authorization": f"Bearer {strict_hub.caller.secret}"},
            timeout=30,
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["type"] == PROBLEM + "callback-refused"


def test_a_local_demo_takes_loopback_and_private_agents_never_link_local(
    store_url: str, tmp_path: Path
) -> None:
    """``reach up`` as shipped: loopback bind, auth off; the operator's switch is off."""
    env = hub_env(store_url, tmp_path, REACH_SECURITY__ALLOW_LOOPBACK_AGENTS="false")
    port = free_port()
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", proc)

        def register(addr: str) -> requests.Response:
            body = {"agent_id": "demo", "instance_id": addr.replace(":", "-"), "addr": addr,
                    "allow_loopback": True, "capabilities": [{"type": "m"}]}  # fmt: skip
            return requests.post(f"{url}/v1/agents/register", json=body, timeout=30)

        assert register("127.0.0.1:7001").status_code == 201
        assert register("10.0.0.5:7001").status_code == 201
        _refused(register("169.254.169.254:80"), "address-refused")
    finally:
        proc.stop()


# -- connection time: the hub's transport and prober, real listeners ------------------------


def test_every_connection_is_judged_when_it_is_made() -> None:
    """The rule travels with the connector and the prober: a name is resolved and judged
    as the connection is made (DNS may answer differently than at registration), an IP
    literal before it; a refused address is never connected to."""
    listener = SlowHttpListener(delay=0)
    strict, loopback = NetworkRule(), NetworkRule(loopback=True)
    name = hosts_file_loopback_name() or "localhost"
    try:
        http = AgentHttp(network=strict)

        async def post(url: str, rule: NetworkRule | None = None) -> Any:
            try:
                return await http.post(url, {"x": 1}, 2.0, 2.0, rule=rule)
            finally:
                await http.close_all()

        for url in (f"http://{name}:{listener.port}/tasks/m", f"{listener.addr}/tasks/m"):
            full = url if url.startswith("http") else f"http://{url}"
            answer = asyncio.run(post(full))
            assert answer.status is None and "address refused" in str(answer.error), answer
        probe = probe_once(ProbeTarget("i", f"http://{name}:{listener.port}"), 2.0, rule=strict)
        assert not probe.sample.ok and "address refused" in str(probe.error)
        assert listener.gauge.total == 0, "a refused address was connected to"
        # the same calls under a rule that takes loopback agents do connect
        assert asyncio.run(post(f"http://{name}:{listener.port}/tasks/m", loopback)).status
        assert probe_once(ProbeTarget("i", f"http://{name}:{listener.port}"), 2.0,
                          rule=loopback).sample.ok  # fmt: skip
        assert listener.gauge.total == 2
    finally:
        listener.close()


# -- redirects and raw answers, through a hub with a worker --------------------------------


class Doors:
    """Two doors on 127.0.0.1: ``agent`` answers each delivery as ``answers`` says (by
    method), ``internal`` stands for something inside the hub's network and counts every
    request that reaches it."""

    SECRET = "INTERNAL-ONLY-7f3c"

    def __init__(self) -> None:
        self.internal_hits: Counter[str] = Counter()
        outer = self

        class Internal(BaseHTTPRequestHandler):
            def _hit(self) -> None:
                outer.internal_hits[self.command] += 1
                data = json.dumps({"message": outer.SECRET, "token": outer.SECRET}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _hit

            def log_message(self, *args: Any) -> None:
                pass

        self.internal = ThreadingHTTPServer(("127.0.0.1", 0), Internal)
        internal_url = f"http://127.0.0.1:{self.internal.server_address[1]}/admin/secret"

        class Agent(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                method = self.path.rsplit("/", 1)[-1]
                if method == "redirect":
                    self.send_response(303)
                    self.send_header("Location", internal_url)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = f"<html>{outer.SECRET} page</html>".encode()  # method "page"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # probes
                if self.path == "/.well-known/agent-card.json":  # an A2A card moved
                    self.send_response(302)
                    self.send_header("Location", outer.card_target)
                else:
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.card_target = ""
        self.agent = ThreadingHTTPServer(("127.0.0.1", 0), Agent)
        self.agent_addr = f"127.0.0.1:{self.agent.server_address[1]}"
        for server in (self.internal, self.agent):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.internal, self.agent):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def doors() -> Iterator[Doors]:
    d = Doors()
    yield d
    d.close()


@pytest.fixture(scope="module")
def stack_with_worker(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("net-stack")
    store = home / "reach.db"
    store.write_bytes(sqlite_template.read_bytes())
    extra = {"REACH_ROUTER__MAX_RETRY": "0", "REACH_PROBE__INTERVAL": "0.5"}
    s = start_stack(f"sqlite:///{store}", home, extra)
    try:
        yield s
    finally:
        stop_stack(s)


def _finished(stack: Stack, task_id: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (t := stack.task(task_id))["status"] in ("failed", "dead", "success") and t,
            timeout=60,
            what=f"task {task_id} to end",
        )
    )


def test_redirects_are_not_followed_and_raw_answers_never_reach_the_caller(
    stack_with_worker: Stack, doors: Doors
) -> None:
    s = stack_with_worker
    body = {"agent_id": "doors", "addr": doors.agent_addr, "allow_loopback": True,
            "capabilities": [{"type": "page"}, {"type": "redirect"}]}  # fmt: skip
    assert requests.post(f"{s.url}/v1/agents/register", json=body, timeout=30).ok
    for method in ("page", "redirect"):
        sent = requests.post(
            f"{s.url}/v1/tasks", json={"agent_id": "doors", "method": method}, timeout=30
        )
        assert sent.status_code == 201, sent.text
        task = _finished(s, sent.json()["task_id"])
        assert task["status"] != "success"
        shown = json.dumps(task) + json.dumps(s.events(task["task_id"]))
        assert Doors.SECRET not in shown, f"{method}: the agent's raw answer reached the caller"
        assert "not a Reach envelope" in shown or "non-JSON body" in shown or "HTTP 303" in shown
    assert sum(doors.internal_hits.values()) == 0, "a redirect was followed"


def test_an_a2a_card_that_redirects_is_not_followed(
    stack_with_worker: Stack, doors: Doors, tmp_path: Path
) -> None:
    """The card answers 302 to a real A2A agent's card elsewhere: the hub does not go."""
    echo = A2aEchoProcess(free_port(), tmp_path / "echo.jsonl", streaming=False)
    try:
        wait_http_ok(echo.url + "/.well-known/agent-card.json")
        doors.card_target = echo.url + "/.well-known/agent-card.json"
        answer = requests.post(
            f"{stack_with_worker.url}/api/v1/agents/a2a",
            json={"card_url": f"http://{doors.agent_addr}", "allow_loopback": True},
            timeout=30,
        )
        assert answer.status_code == 502, answer.text
        assert answer.json()["type"] == PROBLEM + "agent-card-unavailable"
        assert "HTTP 302" in answer.json()["detail"]
    finally:
        echo.stop()


# -- item 12: delivery errors name the kind of failure, not the address -------------------


def _messages(stack: Stack, task: dict[str, Any]) -> str:
    """Every delivery error a caller is shown for the task: its own, and those its events
    carry (a retry's, the terminal failure's). The ``dispatched`` event names the
    endpoint the registrant declared, which is no error and tells it nothing new."""
    texts = [json.dumps(task.get("error"))]
    for event in stack.events(task["task_id"]):
        texts.append(json.dumps((event.get("detail") or {}).get("error")))
    return "\n".join(texts)


def test_delivery_errors_name_the_kind_of_failure_not_the_address(
    stack_with_worker: Stack,
) -> None:
    """A port-scan oracle: an agent key registers its "agent" at each port of a host
    and reads which refuse and which are silent from the task errors. They now say only
    the kind of failure; neither the host nor the port is quoted."""
    s = stack_with_worker
    closed = closed_port()
    silent = SlowHttpListener(delay=3600)  # accepts, never answers
    try:
        for agent_id, port, kind in (("scan-closed", closed, "connection refused"),
                                     ("scan-silent", silent.port, "timed out")):  # fmt: skip
            body = {"agent_id": agent_id, "addr": f"127.0.0.1:{port}", "allow_loopback": True,
                    "capabilities": [{"type": "m"}]}  # fmt: skip
            assert requests.post(f"{s.url}/v1/agents/register", json=body, timeout=30).ok
            sent = requests.post(
                f"{s.url}/v1/tasks",
                json={"agent_id": agent_id, "method": "m", "timeout_ms": 1000},
                timeout=30,
            )
            assert sent.status_code == 201, sent.text
            task = _finished(s, sent.json()["task_id"])
            assert task["status"] == "dead", task
            shown = _messages(s, task)
            assert kind in shown, shown
            assert str(port) not in shown, f"the port is quoted: {shown}"
            assert "127.0.0.1" not in shown, f"the address is quoted: {shown}"
    finally:
        silent.close()
