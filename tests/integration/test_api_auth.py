"""Who may call the hub's API: API keys, scopes, agents and ownership, through a real
``reach api`` process with ``REACH_SECURITY__REQUIRE_AUTH=true`` on SQLite and PostgreSQL.

Keys are created in the store with `reach.hub.security.apikeys` (as ``reach keys create`` does on
the hub host). Every refusal is checked for its status and problem type, for leaving the
store as it was (every row of every table; a forbidden attempt adds its one audit row),
and for never echoing a secret; at the end, the API's log, the task events and every row
of the store are searched for the secrets. Deliveries that put a task in front of an
agent are made by this process with the hub's own `deliver_attempt` to a real HTTP
endpoint (no worker runs: nothing but the requests under test touches the store).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from reach.core.security.auth import Scope
from reach.errors import UnknownKey
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.transports import AgentTransport
from reach.hub.flow.breakers import Breakers
from reach.hub.security import apikeys
from reach.hub.security.apikeys import CreatedKey
from reach.hub.settings import load_settings
from reach.hub.storage import create_engine_for
from reach.hub.storage.models import (
    ApiKeyRow,
    AuditRow,
    DagRunRow,
    DeadLetterRow,
    TaskEventRow,
    TaskRow,
)
from reach.worker.context import HubContext
from tests.support.envelope_server import EnvelopeServer
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.stores import snapshot

TYPE = "urn:agent-reach:problem:"
PROBLEM = "application/problem+json"
METHOD = "m"


@dataclass
class Keys:
    admin: CreatedKey
    caller: CreatedKey
    caller2: CreatedKey
    viewer: CreatedKey
    agents_a: CreatedKey  # agent key for "a-*"
    agent_b: CreatedKey  # agent key for exactly "b"
    expired: CreatedKey
    revoked: CreatedKey


@dataclass
class Hub:
    url: str
    engine: Engine
    proc: HubProcess
    keys: Keys
    delivering: HubContext  # this process, in the worker's place
    dead_letter_id: int
    presented: list[str] = field(default_factory=list)  # every secret a request carried

    def secrets(self) -> list[str]:
        found = [v.secret for v in vars(self.keys).values() if isinstance(v, CreatedKey)]
        return [s for s in found + self.presented if len(s) >= 20]  # not "garbage", ""

    def call(
        self,
        method: str,
        path: str,
        key: CreatedKey | str | None = None,
        *,
        header: str | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        if isinstance(key, CreatedKey):
            key = key.secret
        if key is not None:
            header = f"Bearer {key}"
            self.presented.append(key)
        if header is not None:
            headers["Authorization"] = header
        return requests.request(method, self.url + path, headers=headers, timeout=10, **kwargs)


def create_key(engine: Engine, scope: Scope, pattern: str | None = None, **kw: Any) -> CreatedKey:
    with Session(engine) as session, session.begin():
        return apikeys.create_key(
            session,
            scope=scope,
            agent_pattern=pattern,
            name=kw.get("name", f"test {scope.value}"),
            expires_in_s=kw.get("expires_in_s"),
            now=kw.get("now", time.time()),
        )


def revoke(engine: Engine, key_id: str) -> None:
    with Session(engine) as session, session.begin():
        apikeys.revoke_key(session, key_id, time.time())


@pytest.fixture(scope="module")
def agent_endpoint() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer(status=202)  # answers every delivery "accepted, report later"
    yield server
    server.close()


@pytest.fixture(scope="module")
def hub(
    shared_store_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    agent_endpoint: EnvelopeServer,
) -> Iterator[Hub]:
    home = tmp_path_factory.mktemp("auth-hub")
    engine = create_engine_for(shared_store_url)
    keys = Keys(
        admin=create_key(engine, Scope.ADMIN),
        caller=create_key(engine, Scope.CALLER),
        caller2=create_key(engine, Scope.CALLER),
        viewer=create_key(engine, Scope.VIEWER),
        agents_a=create_key(engine, Scope.AGENT, "a-*"),
        agent_b=create_key(engine, Scope.AGENT, "b"),
        expired=create_key(engine, Scope.ADMIN, expires_in_s=5, now=time.time() - 60),
        revoked=create_key(engine, Scope.ADMIN),
    )
    revoke(engine, keys.revoked.key_id)
    port = free_port()
    # this module fails hundreds of credentials from one address on purpose: no lockout
    # (tests/security/test_login_limits.py tests it)
    env = hub_env(
        shared_store_url,
        home,
        REACH_SECURITY__REQUIRE_AUTH="true",
        REACH_SECURITY__AUTH_FAILURES_MAX="100000",
        # beats written at once: the tests compare the store before and after a refused
        # request, and a buffered beat of an earlier test flushed between them is a write
        REACH_HEARTBEAT__FLUSH_S="0",
    )
    proc = HubProcess(["api", "--port", str(port)], env, home / "api.log")
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": shared_store_url,
            "REACH_HOME": str(home),
            "REACH_ROUTER__MAX_RETRY": "0",  # one failed delivery dead-letters the task
        }
    )
    delivering = HubContext(settings=settings, engine=engine)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc)
        hub = Hub(f"http://127.0.0.1:{port}", engine, proc, keys, delivering, 0)
        register(hub, keys.agents_a, "a-1", "i-a-1", agent_endpoint.addr)
        register(hub, keys.agent_b, "b", "i-b", f"127.0.0.1:{free_port()}")  # nobody listens
        # a dead letter to replay: a task for b, whose door is closed
        dead_task = submit(hub, keys.caller, "b")
        deliver(hub, dead_task)
        with Session(engine) as session:
            dead = session.scalar(
                select(DeadLetterRow.id).where(DeadLetterRow.task_id == dead_task)
            )
        assert dead is not None, "the delivery to b did not dead-letter"
        hub.dead_letter_id = dead
        yield hub
    finally:
        proc.stop()
        delivering.engine.dispose()


def register(hub: Hub, key: CreatedKey, agent_id: str, instance_id: str, addr: str) -> None:
    answer = hub.call(
        "POST", "/v1/agents/register", key, json=registration(agent_id, instance_id, addr)
    )
    assert answer.status_code in (200, 201), answer.text


def registration(agent_id: str, instance_id: str, addr: str = "127.0.0.1:9") -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "instance_id": instance_id,
        "addr": addr,
        "allow_loopback": True,
        "capabilities": [{"type": METHOD}],
    }


def submit(hub: Hub, key: CreatedKey, agent_id: str = "a-1", **body: Any) -> str:
    answer = hub.call(
        "POST", "/v1/tasks", key, json={"agent_id": agent_id, "method": METHOD, **body}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["task_id"])


def deliver(hub: Hub, task_id: str) -> None:
    ctx = hub.delivering
    deliver_attempt(
        ctx.db,
        task_id,
        1,
        now=ctx.clock.now,
        policy=ctx.policy,
        dpolicy=ctx.delivery_policy,
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


def delivered(hub: Hub) -> str:
    """A task for a-1 that the agent took (202): it waits on a-1's report."""
    beat = {"agent_id": "a-1", "instance_id": "i-a-1"}  # fresh: no beat sweeps here
    assert hub.call("POST", "/v1/agents/heartbeat", hub.keys.agents_a, json=beat).ok
    task_id = submit(hub, hub.keys.caller)
    deliver(hub, task_id)
    row = task_row(hub, task_id)
    assert (row.status, row.instance_id) == ("executing", "i-a-1"), row.status
    return task_id


def task_row(hub: Hub, task_id: str) -> TaskRow:
    with Session(hub.engine) as session:
        row = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert row is not None
        session.expunge(row)
        return row


def actors(hub: Hub, task_id: str) -> list[tuple[str, str]]:
    """(kind, actor) of the task's events, as the API shows them to an admin."""
    answer = hub.call("GET", f"/v1/tasks/{task_id}/events", hub.keys.admin)
    assert answer.status_code == 200, answer.text
    return [(e["kind"], e["actor"]) for e in answer.json()["events"]]


def domain(hub: Hub) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table but the audit log (forbidden attempts are written there)."""
    rows = snapshot(hub.engine)
    rows.pop("audit_log")
    return rows


def audit_count(hub: Hub) -> int:
    with Session(hub.engine) as session:
        return int(session.scalar(select(func.count()).select_from(AuditRow)) or 0)


def last_audit(hub: Hub) -> AuditRow:
    with Session(hub.engine) as session:
        row = session.scalar(select(AuditRow).order_by(AuditRow.id.desc()).limit(1))
        assert row is not None
        session.expunge(row)
        return row


def assert_problem(hub: Hub, answer: requests.Response, status: int, slug: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith(PROBLEM), answer.headers
    body: dict[str, Any] = answer.json()
    assert body["type"] == TYPE + slug, body
    assert body["status"] == status
    for secret in hub.secrets():
        assert secret not in answer.text
        assert secret not in repr(dict(answer.headers))
    return body


# -- no valid credential: 401 -----------------------------------------------------------

BAD_CREDENTIALS: dict[str, Callable[[Keys], str | None]] = {
    "missing": lambda k: None,
    "bearer-without-key": lambda k: "Bearer",
    "bearer-blank": lambda k: "Bearer    ",
    "basic": lambda k: "Basic x",
    "basic-userpass": lambda k: "Basic dXNlcjpwYXNz",
    "garbage": lambda k: "garbage",
    "bearer-garbage": lambda k: "Bearer garbage",
    "bearer-jwt-shaped": lambda k: "Bearer eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln",
    "unknown-id": lambda k: f"Bearer rk_{uuid.uuid4().hex[:16]}_{'Q' * 43}",
    "wrong-secret": lambda k: f"Bearer rk_{k.admin.key_id}_{'Q' * 43}",
    "secret-one-char-longer": lambda k: f"Bearer {k.admin.secret}x",
    "expired": lambda k: f"Bearer {k.expired.secret}",
    "revoked": lambda k: f"Bearer {k.revoked.secret}",
}

# (method, path, body): a write and reads of every kind of route that needs a key
PROTECTED = [
    ("POST", "/v1/tasks", {"agent_id": "a-1", "method": METHOD}),
    ("POST", "/v1/agents/heartbeat", {"agent_id": "a-1", "instance_id": "i-a-1"}),
    ("POST", "/v1/agents/register", registration("a-9", "i-a-9")),
    ("GET", "/api/v1/agents", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/tasks/no-such-task", None),
    ("POST", "/api/v1/dead-letters/1/replay", None),
]


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
@pytest.mark.parametrize(("method", "path", "body"), PROTECTED, ids=lambda v: str(v)[:30])
def test_a_request_without_a_valid_credential_is_refused_401(
    hub: Hub, credential: str, method: str, path: str, body: Any
) -> None:
    header = BAD_CREDENTIALS[credential](hub.keys)
    if header is not None and header.startswith("Bearer "):
        hub.presented.append(header.removeprefix("Bearer ").strip())
    before, audited = snapshot(hub.engine), audit_count(hub)
    answer = hub.call(method, path, header=header, json=body)
    problem = assert_problem(hub, answer, 401, "unauthenticated")
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert snapshot(hub.engine) == before  # nothing written, the audit log neither
    assert audit_count(hub) == audited
    if credential in ("unknown-id", "wrong-secret"):
        assert problem["detail"] == "invalid API key"  # no oracle for which key ids exist


def test_a_malformed_body_without_a_key_is_still_401(hub: Hub) -> None:
    """Authentication comes before the body is read: no parse errors for strangers."""
    answer = hub.call(
        "POST", "/v1/tasks", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert_problem(hub, answer, 401, "unauthenticated")


def test_the_open_paths_need_no_key(hub: Hub) -> None:
    for path in ("/healthz", "/.well-known/jwks.json"):
        assert hub.call("GET", path).status_code == 200, path
    # the API's description takes a key; its CDN pages are not served (issue 37, item 20)
    assert_problem(hub, hub.call("GET", "/openapi.json"), 401, "unauthenticated")
    assert hub.call("GET", "/openapi.json", hub.keys.caller).status_code == 200


def test_revocation_and_expiry_act_on_the_next_request(hub: Hub) -> None:
    key = create_key(hub.engine, Scope.CALLER)
    assert_problem(hub, hub.call("GET", "/v1/tasks/no-such", key), 404, "unknown-task")
    revoke(hub.engine, key.key_id)
    body = assert_problem(hub, hub.call("GET", "/v1/tasks/no-such", key), 401, "unauthenticated")
    assert body["detail"] == f"API key {key.key_id} is revoked"  # told only to its holder

    short = create_key(hub.engine, Scope.CALLER, expires_in_s=1.5)
    assert_problem(hub, hub.call("GET", "/v1/tasks/no-such", short), 404, "unknown-task")
    time.sleep(1.6)
    body = assert_problem(hub, hub.call("GET", "/v1/tasks/no-such", short), 401, "unauthenticated")
    assert body["detail"] == f"API key {short.key_id} is expired"


# -- a valid key outside its scope or agent: 403, audited -------------------------------


def forbidden_cases(hub: Hub) -> dict[str, tuple[CreatedKey, str, str, Any]]:
    k = hub.keys
    task = "t-forbidden-target"
    dead = f"/api/v1/dead-letters/{hub.dead_letter_id}/replay"
    many = "/api/v1/dead-letters/replay"
    return {
        "viewer-submits": (k.viewer, "POST", "/v1/tasks", {"agent_id": "a-1", "method": METHOD}),
        "viewer-broadcasts": (k.viewer, "POST", "/v1/broadcasts", {"tags": ["x"], "method": "m"}),
        "viewer-starts-dag": (k.viewer, "POST", "/api/v1/dag-runs", {"dag": {}}),
        "viewer-registers": (k.viewer, "POST", "/v1/agents/register", registration("a-9", "i9")),
        "viewer-replays": (k.viewer, "POST", dead, None),
        "viewer-replays-many": (k.viewer, "POST", many, {"ids": [hub.dead_letter_id]}),
        "caller-replays-many": (k.caller, "POST", many, {"ids": [hub.dead_letter_id]}),
        "caller-lists-agents": (k.caller, "GET", "/api/v1/agents", None),
        "caller-reads-agent": (k.caller, "GET", "/api/v1/agents/a-1", None),
        "caller-reads-instance-events": (k.caller, "GET", "/api/v1/instances/i-a-1/events", None),
        "caller-reads-metrics": (k.caller, "GET", "/metrics", None),
        "caller-lists-dead-letters": (k.caller, "GET", "/api/v1/dead-letters", None),
        "caller-replays": (k.caller, "POST", dead, None),
        "agent-replays": (k.agents_a, "POST", dead, None),
        "caller-registers": (k.caller, "POST", "/v1/agents/register", registration("a-9", "i9")),
        "caller-heartbeats": (
            k.caller, "POST", "/v1/agents/heartbeat", {"agent_id": "a-1", "instance_id": "i-a-1"}
        ),
        "a-key-heartbeats-b": (
            k.agents_a, "POST", "/v1/agents/heartbeat", {"agent_id": "b", "instance_id": "i-b"}
        ),
        "a-key-registers-b": (
            k.agents_a, "POST", "/v1/agents/register", registration("b", "i-b2")
        ),
        "a-key-deregisters-b": (
            k.agents_a, "POST", "/v1/agents/deregister", {"agent_id": "b", "instance_id": "i-b"}
        ),
        "b-key-heartbeats-a": (
            k.agent_b, "POST", "/v1/agents/heartbeat", {"agent_id": "a-1", "instance_id": "i-a-1"}
        ),
        "caller-reports-result": (
            k.caller, "POST", f"/v1/tasks/{task}/result", {"attempt_seq": 1, "instance_id": "i-a-1"}
        ),
        "viewer-reports-progress": (
            k.viewer, "POST", f"/v1/tasks/{task}/progress", {"attempt_seq": 1, "instance_id": "x"}
        ),
    }  # fmt: skip


FORBIDDEN = [
    "viewer-submits", "viewer-broadcasts", "viewer-starts-dag", "viewer-registers",
    "viewer-replays", "viewer-replays-many", "caller-replays-many", "caller-lists-agents",
    "caller-reads-agent",
    "caller-reads-instance-events", "caller-reads-metrics", "caller-lists-dead-letters",
    "caller-replays", "agent-replays", "caller-registers", "caller-heartbeats",
    "a-key-heartbeats-b", "a-key-registers-b", "a-key-deregisters-b", "b-key-heartbeats-a",
    "caller-reports-result", "viewer-reports-progress",
]  # fmt: skip


@pytest.mark.parametrize("case", FORBIDDEN)
def test_a_key_outside_its_scope_or_agent_is_refused_403_and_audited(hub: Hub, case: str) -> None:
    key, method, path, body = forbidden_cases(hub)[case]
    if case == "caller-reports-result":  # on a real task that waits on a-1's report
        task_id = delivered(hub)
        path = path.replace("t-forbidden-target", task_id)
    before, audited = domain(hub), audit_count(hub)
    answer = hub.call(method, path, key, json=body)
    assert_problem(hub, answer, 403, "forbidden")
    assert domain(hub) == before
    assert audit_count(hub) == audited + 1
    row = last_audit(hub)
    identity = "agent:b" if key is hub.keys.agent_b else f"key:{key.key_id}"
    assert (row.actor, row.outcome) == (identity, "refused")
    assert row.detail["path"] == path and row.detail["method"] == method
    assert key.secret not in repr(row.detail)


def test_a_valid_key_inside_its_scope_passes(hub: Hub) -> None:
    k = hub.keys
    heartbeat = {"agent_id": "b", "instance_id": "i-b"}
    assert hub.call("POST", "/v1/agents/heartbeat", k.agent_b, json=heartbeat).status_code == 200
    heartbeat = {"agent_id": "a-1", "instance_id": "i-a-1"}
    assert hub.call("POST", "/v1/agents/heartbeat", k.agents_a, json=heartbeat).status_code == 200
    for key in (k.admin, k.viewer):
        for path in ("/api/v1/agents", "/api/v1/agents/a-1", "/metrics", "/api/v1/dead-letters"):
            assert hub.call("GET", path, key).status_code == 200, (key.scope, path)


# -- not yours looks like not found ---------------------------------------------------


def same_but_ids(found: dict[str, Any], unknown: dict[str, Any], real: str, fake: str) -> None:
    """Two problem bodies identical once the id each names is swapped."""
    assert repr(found).replace(real, "<id>") == repr(unknown).replace(fake, "<id>")


def test_a_report_for_another_agents_task_is_not_found(hub: Hub) -> None:
    task_id = delivered(hub)
    fake = "t-" + uuid.uuid4().hex
    for kind, body in (
        ("result", {"code": 0, "data": {"forged": True}, "attempt_seq": 1, "instance_id": "i-a-1"}),
        ("progress", {"progress": 0.5, "attempt_seq": 1, "instance_id": "i-a-1"}),
    ):
        before, audited = domain(hub), audit_count(hub)
        answer = hub.call("POST", f"/v1/tasks/{task_id}/{kind}", hub.keys.agent_b, json=body)
        found = assert_problem(hub, answer, 404, "unknown-task")
        assert domain(hub) == before and audit_count(hub) == audited
        unknown = hub.call("POST", f"/v1/tasks/{fake}/{kind}", hub.keys.agent_b, json=body)
        same_but_ids(found, assert_problem(hub, unknown, 404, "unknown-task"), task_id, fake)
    assert task_row(hub, task_id).status == "executing"


def test_another_callers_task_is_not_found(hub: Hub) -> None:
    k = hub.keys
    task_id = submit(hub, k.caller)
    fake = "t-" + uuid.uuid4().hex
    for suffix in ("", "/events", "?wait=0.2", "/stream"):  # the stream reads as the task does
        before = snapshot(hub.engine)
        answer = hub.call("GET", f"/v1/tasks/{task_id}{suffix}", k.caller2)
        found = assert_problem(hub, answer, 404, "unknown-task")
        unknown = assert_problem(
            hub, hub.call("GET", f"/v1/tasks/{fake}{suffix}", k.caller2), 404, "unknown-task"
        )
        same_but_ids(found, unknown, task_id, fake)
        assert snapshot(hub.engine) == before
    # b's key: not its task (it goes to a-1); the key of a-* may read what a-1 was sent
    assert hub.call("GET", f"/v1/tasks/{task_id}", k.agent_b).status_code == 404
    for key in (k.caller, k.admin, k.viewer, k.agents_a):
        answer = hub.call("GET", f"/v1/tasks/{task_id}", key)
        assert answer.status_code == 200, (key.scope, answer.text)
        assert answer.json()["caller"] == f"key:{k.caller.key_id}"


def test_another_callers_dag_run_is_not_found(hub: Hub) -> None:
    k = hub.keys
    dag = {"name": "auth", "nodes": [{"id": "only", "agent_id": "a-1", "method": METHOD}]}
    started = hub.call("POST", "/api/v1/dag-runs", k.caller, json={"dag": dag})
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    with Session(hub.engine) as session:
        owner = session.scalar(select(DagRunRow.caller).where(DagRunRow.run_id == run_id))
    assert owner == f"key:{k.caller.key_id}"
    answer = hub.call("GET", f"/api/v1/dag-runs/{run_id}", k.caller2)
    found = assert_problem(hub, answer, 404, "unknown-task")
    fake = "dag-" + uuid.uuid4().hex[:16]
    unknown = assert_problem(
        hub, hub.call("GET", f"/api/v1/dag-runs/{fake}", k.caller2), 404, "unknown-task"
    )
    same_but_ids(found, unknown, run_id, fake)
    streamed = hub.call("GET", f"/api/v1/dag-runs/{run_id}/stream", k.caller2)
    assert_problem(hub, streamed, 404, "unknown-task")  # the stream reads as the run does
    for key in (k.caller, k.admin, k.viewer):
        assert hub.call("GET", f"/api/v1/dag-runs/{run_id}", key).status_code == 200


# -- identities recorded --------------------------------------------------------------


def test_tasks_and_their_events_name_the_identity_behind_them(hub: Hub) -> None:
    k = hub.keys
    task_id = delivered(hub)
    assert task_row(hub, task_id).caller == f"key:{k.caller.key_id}"
    progress = {"progress": 0.5, "attempt_seq": 1, "instance_id": "i-a-1"}
    answer = hub.call("POST", f"/v1/tasks/{task_id}/progress", k.agents_a, json=progress)
    assert answer.status_code == 200, answer.text
    result = {"code": 0, "data": {"ok": 1}, "attempt_seq": 1, "instance_id": "i-a-1"}
    answer = hub.call("POST", f"/v1/tasks/{task_id}/result", k.agents_a, json=result)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "success"
    trail = actors(hub, task_id)
    assert trail[0] == ("accepted", f"key:{k.caller.key_id}")
    assert ("progress", "agent:a-1") in trail  # the key of a-* acting as the task's agent
    assert ("terminal_success", "agent:a-1") in trail
    steps = [
        actor for kind, actor in trail if kind not in ("accepted", "progress", "terminal_success")
    ]
    assert steps and set(steps) == {"hub"}  # the delivery's own events: the hub's


def test_an_agent_key_sends_as_the_agent_whose_handler_it_is_in(hub: Hub) -> None:
    k = hub.keys
    inside = {"root_id": "r-1", "parent_task_id": "t-parent", "hops": 1, "path": ["x", "a-1"]}
    task_id = submit(hub, k.agents_a, "b", trace=inside)
    assert task_row(hub, task_id).caller == "agent:a-1"
    assert actors(hub, task_id)[0] == ("accepted", "agent:a-1")
    outside = {**inside, "path": ["a-1", "zzz"]}  # the last hop is not one of its agents
    assert (
        task_row(hub, submit(hub, k.agents_a, "b", trace=outside)).caller
        == f"key:{k.agents_a.key_id}"
    )
    assert task_row(hub, submit(hub, k.agent_b, "a-1")).caller == "agent:b"


def test_a_caller_cannot_name_its_own_identity(hub: Hub) -> None:
    before = domain(hub)
    body = {"agent_id": "a-1", "method": METHOD, "caller": "key:someone-else"}
    answer = hub.call("POST", "/v1/tasks", hub.keys.caller, json=body)
    assert_problem(hub, answer, 422, "invalid-task-request")
    assert domain(hub) == before


def test_a_task_id_taken_by_another_identity_is_a_conflict(hub: Hub) -> None:
    k = hub.keys
    body = {"task_id": f"mine-{uuid.uuid4().hex[:8]}", "agent_id": "a-1", "method": METHOD}
    assert hub.call("POST", "/v1/tasks", k.caller, json=body).status_code == 201
    assert hub.call("POST", "/v1/tasks", k.caller, json=body).status_code == 200  # idempotent
    before = domain(hub)
    answer = hub.call("POST", "/v1/tasks", k.caller2, json=body)
    problem = assert_problem(hub, answer, 409, "task-conflict")
    assert set(problem) <= {"type", "title", "status", "detail", "instance", "task_id"}
    assert domain(hub) == before


def test_a_dead_letter_replay_names_the_admin(hub: Hub) -> None:
    k = hub.keys
    task_id = submit(hub, k.caller, "b")
    deliver(hub, task_id)
    with Session(hub.engine) as session:
        dead = session.scalar(select(DeadLetterRow.id).where(DeadLetterRow.task_id == task_id))
    answer = hub.call("POST", f"/api/v1/dead-letters/{dead}/replay", k.admin)
    assert answer.status_code == 200, answer.text
    assert ("replayed", f"key:{k.admin.key_id}") in actors(hub, task_id)


# -- the store's side: apikeys ----------------------------------------------------------


def test_keys_are_stored_as_a_digest_listed_without_it_and_revoked(hub: Hub) -> None:
    key = create_key(hub.engine, Scope.AGENT, "planner", name="planner key", expires_in_s=3600)
    assert key.secret.startswith(f"rk_{key.key_id}_")
    with Session(hub.engine) as session:
        row = session.get(ApiKeyRow, key.key_id)
        assert row is not None and row.secret_hash != key.secret
        assert key.secret not in repr([getattr(row, c) for c in ("secret_hash", "name", "key_id")])
        principal = apikeys.authenticate(session, key.secret, time.time())
        assert (principal.scope, principal.identity) == (Scope.AGENT, "agent:planner")
        listed = {v["key_id"]: v for v in apikeys.list_keys(session, time.time())}
    view = listed[key.key_id]
    assert set(view) == {
        "key_id", "name", "scope", "agent_pattern", "created_at", "expires_at", "revoked_at",
        "state", "allowed_capabilities", "allowed_tags",
    }  # fmt: skip
    assert (view["state"], view["name"], view["agent_pattern"]) == (
        "active",
        "planner key",
        "planner",
    )
    assert listed[hub.keys.revoked.key_id]["state"] == "revoked"
    assert listed[hub.keys.expired.key_id]["state"] == "expired"
    assert key.secret not in repr(listed) and row.secret_hash not in repr(listed)
    with Session(hub.engine) as session, session.begin():
        first = apikeys.revoke_key(session, key.key_id, 100.0)
        again = apikeys.revoke_key(session, key.key_id, 200.0)
        assert first["revoked_at"] == again["revoked_at"] == 100.0
        with pytest.raises(UnknownKey) as refused:
            apikeys.revoke_key(session, "nosuchkey000", 1.0)
    assert (refused.value.status, refused.value.slug) == (404, "unknown-key")


@pytest.mark.parametrize(
    ("scope", "pattern", "kw"),
    [
        (Scope.AGENT, None, {}),
        (Scope.AGENT, "  ", {}),
        (Scope.CALLER, "a-*", {}),
        (Scope.AGENT, "x" * 129, {}),
        (Scope.CALLER, None, {"name": "n" * 129}),
        (Scope.CALLER, None, {"expires_in_s": 0}),
        (Scope.CALLER, None, {"expires_in_s": -5}),
    ],
)
def test_a_key_that_could_never_be_used_is_not_created(
    hub: Hub, scope: Scope, pattern: str | None, kw: dict[str, Any]
) -> None:
    with Session(hub.engine) as session:
        count = session.scalar(select(func.count()).select_from(ApiKeyRow))
    with pytest.raises(ValueError):
        create_key(hub.engine, scope, pattern, **kw)
    with Session(hub.engine) as session:
        assert session.scalar(select(func.count()).select_from(ApiKeyRow)) == count


# -- last: what was logged, counted and stored ------------------------------------------


def _provoke_every_refusal(hub: Hub) -> None:
    """One request per refusal reason: this test must not depend on which of the module's
    other tests ran before it in its xdist worker."""
    body = {"agent_id": "a-1", "method": METHOD}
    k = hub.keys
    assert hub.call("POST", "/v1/tasks", json=body).status_code == 401  # missing
    assert hub.call("POST", "/v1/tasks", header="Basic x", json=body).status_code == 401
    unknown = f"rk_{'0' * 16}_{'x' * 43}"
    assert hub.call("POST", "/v1/tasks", unknown, json=body).status_code == 401
    wrong = f"rk_{k.admin.key_id}_{'y' * 43}"
    assert hub.call("POST", "/v1/tasks", wrong, json=body).status_code == 401
    assert hub.call("POST", "/v1/tasks", k.expired, json=body).status_code == 401
    assert hub.call("POST", "/v1/tasks", k.revoked, json=body).status_code == 401
    assert hub.call("GET", "/api/v1/agents", k.caller).status_code == 403  # forbidden
    beat = {"agent_id": "b", "instance_id": "i-b"}
    assert hub.call("POST", "/v1/agents/heartbeat", k.agents_a, json=beat).status_code == 403
    theirs = submit(hub, k.caller2)
    assert hub.call("GET", f"/v1/tasks/{theirs}", k.caller).status_code == 404  # not yours


def test_zz_refusals_are_logged_and_counted_and_no_secret_is_kept(hub: Hub) -> None:
    _provoke_every_refusal(hub)
    metrics = hub.call("GET", "/metrics", hub.keys.admin).text
    for reason in ("missing", "malformed", "unknown_key", "wrong_secret", "expired", "revoked",
                   "forbidden", "wrong_agent", "not_yours"):  # fmt: skip
        assert f'agentreach_auth_refusals_total{{reason="{reason}"}}' in metrics, reason
    log = hub.proc.output()
    assert "refused POST /v1/tasks: missing (key -)" in log
    assert f"wrong_secret (key {hub.keys.admin.key_id})" in log
    assert f"forbidden (key {hub.keys.caller.key_id})" in log
    stored = repr(snapshot(hub.engine))
    with Session(hub.engine) as session:
        events = repr([(e.detail, e.actor) for e in session.scalars(select(TaskEventRow))])
    secrets = hub.secrets()
    assert len(secrets) > 10
    for secret in secrets:
        assert secret not in log
        assert secret not in stored
        assert secret not in events


# -- an open hub ---------------------------------------------------------------------------


@pytest.fixture
def open_hub(store_url: str, tmp_path: Path) -> Iterator[tuple[str, HubProcess]]:
    port = free_port()
    proc = HubProcess(
        ["api", "--port", str(port)], hub_env(store_url, tmp_path), tmp_path / "api.log"
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


def test_an_open_hub_on_loopback_works_without_keys_but_checks_presented_ones(
    open_hub: tuple[str, HubProcess], engine: Engine
) -> None:
    url, proc = open_hub
    assert "auth is off" in proc.output()
    reg = registration("a-1", "i-1")
    assert requests.post(f"{url}/v1/agents/register", json=reg, timeout=5).status_code == 201
    sent = requests.post(f"{url}/v1/tasks", json={"agent_id": "a-1", "method": METHOD}, timeout=5)
    assert sent.status_code == 201, sent.text
    assert sent.json()["caller"] == "anonymous"
    assert requests.get(f"{url}/api/v1/agents", timeout=5).status_code == 200
    before = snapshot(engine)
    caller = create_key(engine, Scope.CALLER)
    for header in (f"Bearer rk_{caller.key_id}_{'Q' * 43}", "Basic x", "Bearer garbage"):
        answer = requests.get(f"{url}/api/v1/agents", headers={"Authorization": header}, timeout=5)
        assert answer.status_code == 401, (header, answer.text)
        assert answer.json()["type"] == TYPE + "unauthenticated"
    # a valid key is honoured as what it is, even here: a caller key reads no fleet
    answer = requests.get(
        f"{url}/api/v1/agents", headers={"Authorization": f"Bearer {caller.secret}"}, timeout=5
    )
    assert answer.status_code == 403 and answer.json()["type"] == TYPE + "forbidden"
    after = snapshot(engine)
    assert after.pop("api_keys") != before.pop("api_keys")  # only the key we made ...
    assert len(after.pop("audit_log")) == len(before.pop("audit_log")) + 1  # ... and the 403
    assert after == before
    assert caller.secret not in proc.output()


def test_a_hub_listening_beyond_loopback_requires_keys_by_default(
    store_url: str, tmp_path: Path
) -> None:
    port = free_port()
    proc = HubProcess(
        ["api", "--host", "0.0.0.0", "--port", str(port)],
        hub_env(store_url, tmp_path),
        tmp_path / "api.log",
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc)
        answer = requests.get(f"http://127.0.0.1:{port}/api/v1/agents", timeout=5)
        assert answer.status_code == 401, answer.text
        assert answer.json()["type"] == TYPE + "unauthenticated"
        assert "auth is off" not in proc.output()
    finally:
        proc.stop()
