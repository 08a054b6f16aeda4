"""Bad input at every endpoint beyond the registry (whose table is in test_registry_api):
tasks, result and progress reports, broadcasts, DAG runs, dead letters, instance events.

Each refusal is a 4xx ``application/problem+json`` naming what is wrong, and the database
is exactly as it was. Resubmits of one ``task_id`` (sequential and concurrent) make one
task, and a body over the limit is refused whether or not it declares its length.
Out-of-range integers have their own table in test_integer_ranges.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.flow.admission import ENVELOPE_BYTES
from reach.hub.settings import load_settings
from reach.hub.storage import create_engine_for
from reach.hub.storage.models import OutboxRow, TaskEventRow, TaskRow
from reach.worker.context import HubContext
from tests.integration.test_registry_api import PROBLEM, TYPE, reg
from tests.support.stores import snapshot

# the body limit by default: router.max_payload_bytes plus the envelope (admission.body_limit)
LIMIT = 1_048_576 + ENVELOPE_BYTES
BIG = "x" * (LIMIT + 1024)
# a request that fails validation is a 422 of its resource's kind (registration, task,
# DAG); which slug each resource uses is problems.py's business, that it is one is ours
VALIDATION = {TYPE + s for s in ("invalid-request", "invalid-task-request", "dag-error")}
AGENT = "doc-analyzer-01"
KNOWN = "t-known"


@pytest.fixture(scope="module")
def hub(
    shared_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, Engine]]:
    """One in-process hub per store for the module, with one agent (the registry test's)
    and one accepted task: refusals change nothing, so every row can share it."""
    home = tmp_path_factory.mktemp("hub")
    engine = create_engine_for(shared_store_url)
    env = {"REACH_DATABASE_URL": shared_store_url, "REACH_HOME": str(home)}
    ctx = HubContext(
        settings=load_settings(environ=env),
        engine=engine,
        clock=ManualClock(start=1_800_000_000.0),
    )
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        answer = client.post("/v1/agents/register", json=reg(instance_id="i-1"))
        assert answer.status_code == 201, answer.text
        answer = client.post("/v1/tasks", json=task(task_id=KNOWN))
        assert answer.status_code == 201, answer.text
        yield client, engine
    engine.dispose()


@pytest.fixture
def seeded(hub: tuple[TestClient, Engine]) -> TestClient:
    return hub[0]


@pytest.fixture
def db(hub: tuple[TestClient, Engine]) -> Engine:
    return hub[1]


def task(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"agent_id": AGENT, "method": "task.process"}
    body["payload"] = {"doc_id": "d-1"}
    body.update(over)
    return body


def dag(**over: Any) -> dict[str, Any]:
    node = {"id": "only", "agent_id": AGENT, "method": "task.process", "timeout_ms": 1000}
    body: dict[str, Any] = {"name": "d", "nodes": [node]}
    body.update(over)
    return body


def broadcast(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"capability": "task.process", "method": "task.process"}
    body["payload"] = {"doc_id": "d-1"}
    body.update(over)
    return body


def report(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"code": 0, "attempt_seq": 1, "instance_id": "i-1"}
    body.update(over)
    return body


def progress(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"progress": 0.5, "attempt_seq": 1, "instance_id": "i-1"}
    body.update(over)
    return body


# (name, method, path, body, status, slug: None for "a validation problem", field named)
Row = tuple[str, str, str, Any, int, str | None, str]
T = "/v1/tasks"
B = "/v1/broadcasts"
D = "/api/v1/dag-runs"
DL = "/api/v1/dead-letters"
EV = "/api/v1/instances/i-1/events"

ROWS: list[Row] = [
    # -- POST /v1/tasks ---------------------------------------------------------------
    ("task malformed json", "POST", T, b"{not json", 400, "malformed-request", ""),
    ("task empty body", "POST", T, b"", 400, "malformed-request", ""),
    ("task json array", "POST", T, b"[1, 2]", 422, None, ""),
    ("task json string", "POST", T, b'"task"', 422, None, ""),
    ("task unknown field", "POST", T, task(priority=1), 422, None, "priority"),
    ("task no method", "POST", T, {"agent_id": AGENT}, 422, None, "method"),
    ("task no target", "POST", T, {"method": "task.process"}, 422, None, "target"),
    ("task method a number", "POST", T, task(method=5), 422, None, "method"),
    ("task payload a list", "POST", T, task(payload=[1]), 422, None, "payload"),
    ("task payload a string", "POST", T, task(payload="doc"), 422, None, "payload"),
    ("task tags a string", "POST", T, task(tags="doc"), 422, None, "tags"),
    ("task rules a list", "POST", T, task(rules=["region"]), 422, None, "rules"),
    ("task bad task_id", "POST", T, task(task_id="has space"), 422, None, "task_id"),
    ("task task_id a number", "POST", T, task(task_id=7), 422, None, "task_id"),
    ("task timeout_ms zero", "POST", T, task(timeout_ms=0), 422, None, "timeout_ms"),
    ("task timeout_ms negative", "POST", T, task(timeout_ms=-5), 422, None, "timeout_ms"),
    ("task timeout_ms over 1h", "POST", T, task(timeout_ms=3_600_001), 422, None, "timeout_ms"),
    ("task timeout_ms text", "POST", T, task(timeout_ms="soon"), 422, None, "timeout_ms"),
    ("task timeout_ms fraction", "POST", T, task(timeout_ms=1.5), 422, None, "timeout_ms"),
    ("task timeout_ms bool", "POST", T, task(timeout_ms=True), 422, None, "timeout_ms"),
    ("task timeout_ms numeric text", "POST", T, task(timeout_ms="5"), 422, None, "timeout_ms"),
    ("task trace hops", "POST", T, task(trace={"root_id": "r", "hops": -1}), 422, None, "hops"),
    ("task trace no root", "POST", T, task(trace={"hops": 1}), 422, None, "root_id"),
    ("task session too long", "POST", T, task(session_id="s" * 129), 422, None, "session_id"),
    ("task wait negative", "POST", T + "?wait=-1", task(), 422, None, "wait"),
    ("task wait over 60", "POST", T + "?wait=61", task(), 422, None, "wait"),
    ("task wait text", "POST", T + "?wait=soon", task(), 422, None, "wait"),
    ("task wait nan", "POST", T + "?wait=nan", task(), 422, None, "wait"),
    ("task wait inf", "POST", T + "?wait=inf", task(), 422, None, "wait"),
    ("task unknown agent", "POST", T, task(agent_id="nobody"), 404, "no-suitable-agent", ""),
    ("task undeclared method", "POST", T, task(method="other"), 404, "no-suitable-agent", ""),
    ("task payload off schema", "POST", T, task(payload={}), 422, "invalid-payload", "doc_id"),
    ("task too large", "POST", T, task(payload={"doc_id": BIG}), 413, "payload-too-large", ""),
    (
        "task resubmit, other payload",
        "POST",
        T,
        task(task_id=KNOWN, payload={"doc_id": "d-2"}),
        409,
        "task-conflict",
        "",
    ),
    (
        "task resubmit, other target",
        "POST",
        T,
        task(task_id=KNOWN, tags=["doc"]),
        409,
        "task-conflict",
        "",
    ),
    # -- GET /v1/tasks/{id} and its events --------------------------------------------
    ("read wait negative", "GET", f"{T}/{KNOWN}?wait=-1", None, 422, None, "wait"),
    ("read wait over 60", "GET", f"{T}/{KNOWN}?wait=60.5", None, 422, None, "wait"),
    ("read wait text", "GET", f"{T}/{KNOWN}?wait=later", None, 422, None, "wait"),
    ("read unknown task", "GET", f"{T}/nope", None, 404, "unknown-task", ""),
    ("read unknown task, waiting", "GET", f"{T}/nope?wait=0.1", None, 404, "unknown-task", ""),
    ("events unknown task", "GET", f"{T}/nope/events", None, 404, "unknown-task", ""),
    # -- POST /v1/tasks/{id}/result ---------------------------------------------------
    ("result malformed json", "POST", f"{T}/{KNOWN}/result", b"{", 400, "malformed-request", ""),
    ("result json array", "POST", f"{T}/{KNOWN}/result", b"[]", 422, None, ""),
    ("result unknown field", "POST", f"{T}/{KNOWN}/result", report(ok=1), 422, None, "ok"),
    ("result code text", "POST", f"{T}/{KNOWN}/result", report(code="zero"), 422, None, "code"),
    ("result code fraction", "POST", f"{T}/{KNOWN}/result", report(code=0.5), 422, None, "code"),
    (
        "result message too long",
        "POST",
        f"{T}/{KNOWN}/result",
        report(message="m" * 10_001),
        422,
        None,
        "message",
    ),
    (
        "result attempt zero",
        "POST",
        f"{T}/{KNOWN}/result",
        report(attempt_seq=0),
        422,
        None,
        "attempt_seq",
    ),
    (
        "result attempt text",
        "POST",
        f"{T}/{KNOWN}/result",
        report(attempt_seq="one"),
        422,
        None,
        "attempt_seq",
    ),
    (
        "result bad instance id",
        "POST",
        f"{T}/{KNOWN}/result",
        report(instance_id="no spaces"),
        422,
        None,
        "instance_id",
    ),
    ("result unknown task", "POST", f"{T}/nope/result", report(), 404, "unknown-task", ""),
    (
        "result too large",
        "POST",
        f"{T}/{KNOWN}/result",
        report(data=BIG),
        413,
        "payload-too-large",
        "",
    ),
    # -- POST /v1/tasks/{id}/progress -------------------------------------------------
    ("progress malformed", "POST", f"{T}/{KNOWN}/progress", b"nope", 400, "malformed-request", ""),
    (
        "progress over one",
        "POST",
        f"{T}/{KNOWN}/progress",
        progress(progress=1.5),
        422,
        None,
        "progress",
    ),
    (
        "progress negative",
        "POST",
        f"{T}/{KNOWN}/progress",
        progress(progress=-0.1),
        422,
        None,
        "progress",
    ),
    (
        "progress text",
        "POST",
        f"{T}/{KNOWN}/progress",
        progress(progress="half"),
        422,
        None,
        "progress",
    ),
    (
        "progress unknown field",
        "POST",
        f"{T}/{KNOWN}/progress",
        progress(eta=3),
        422,
        None,
        "eta",
    ),
    ("progress unknown task", "POST", f"{T}/nope/progress", progress(), 404, "unknown-task", ""),
    (
        "progress too large",
        "POST",
        f"{T}/{KNOWN}/progress",
        progress(data=BIG),
        413,
        "payload-too-large",
        "",
    ),
    # -- POST /v1/broadcasts and GET /v1/broadcasts/{id} ------------------------------
    ("broadcast malformed json", "POST", B, b"{,}", 400, "malformed-request", ""),
    ("broadcast json array", "POST", B, b"[]", 422, None, ""),
    ("broadcast unknown field", "POST", B, broadcast(agent_id=AGENT), 422, None, "agent_id"),
    ("broadcast no filter", "POST", B, {"method": "task.process"}, 422, None, "broadcast"),
    ("broadcast no method", "POST", B, {"capability": "task.process"}, 422, None, "method"),
    ("broadcast tags a string", "POST", B, broadcast(tags="doc"), 422, None, "tags"),
    ("broadcast min_results 0", "POST", B, broadcast(min_results=0), 422, None, "min_results"),
    ("broadcast max_retry 11", "POST", B, broadcast(max_retry=11), 422, None, "max_retry"),
    ("broadcast timeout_ms 0", "POST", B, broadcast(timeout_ms=0), 422, None, "timeout_ms"),
    ("broadcast timeout_ms bool", "POST", B, broadcast(timeout_ms=True), 422, None, "timeout_ms"),
    ("broadcast max_retry bool", "POST", B, broadcast(max_retry=True), 422, None, "max_retry"),
    ("broadcast min_results 1.0", "POST", B, broadcast(min_results=1.0), 422, None, "min_results"),
    ("broadcast payload list", "POST", B, broadcast(payload=[]), 422, None, "payload"),
    ("broadcast nobody matches", "POST", B, broadcast(capability="x"), 404, None, ""),
    (
        "broadcast too large",
        "POST",
        B,
        broadcast(payload={"doc_id": BIG}),
        413,
        "payload-too-large",
        "",
    ),
    ("broadcast wait negative", "GET", f"{B}/b-1?wait=-1", None, 422, None, "wait"),
    ("broadcast wait over 60", "GET", f"{B}/b-1?wait=61", None, 422, None, "wait"),
    ("broadcast unknown", "GET", f"{B}/b-nope", None, 404, None, ""),
    # -- POST /api/v1/dag-runs and GET /api/v1/dag-runs/{id} --------------------------
    ("dag malformed json", "POST", D, b"{dag", 400, "malformed-request", ""),
    ("dag json array", "POST", D, b"[]", 422, None, ""),
    ("dag missing", "POST", D, {"input": {}}, 422, None, "dag"),
    ("dag unknown field", "POST", D, {"dag": dag(), "when": "now"}, 422, None, "when"),
    ("dag a list", "POST", D, {"dag": [dag()]}, 422, None, "dag"),
    ("dag input a list", "POST", D, {"dag": dag(), "input": [1]}, 422, None, "input"),
    ("dag no nodes", "POST", D, {"dag": dag(nodes=[])}, 422, "dag-error", ""),
    ("dag nodes a string", "POST", D, {"dag": dag(nodes="only")}, 422, "dag-error", ""),
    (
        "dag unknown dependency",
        "POST",
        D,
        {"dag": dag(nodes=[{**dag()["nodes"][0], "dependencies": ["ghost"]}])},
        422,
        "dag-error",
        "",
    ),
    (
        "dag cycle",
        "POST",
        D,
        {
            "dag": dag(
                nodes=[
                    {**dag()["nodes"][0], "id": "a", "dependencies": ["b"]},
                    {**dag()["nodes"][0], "id": "b", "dependencies": ["a"]},
                ]
            )
        },
        422,
        "dag-error",
        "",
    ),
    (
        "dag unknown target",
        "POST",
        D,
        {"dag": dag(nodes=[{**dag()["nodes"][0], "agent_id": "nobody"}])},
        422,
        None,
        "",
    ),
    ("dag too large", "POST", D, {"dag": dag(), "input": {"x": BIG}}, 413, "payload-too-large", ""),
    ("dag run unknown", "GET", f"{D}/r-nope", None, 404, None, ""),
    # -- dead letters -----------------------------------------------------------------
    ("dead letter id text", "GET", f"{DL}/abc", None, 422, None, "dead_id"),
    ("dead letter id zero", "GET", f"{DL}/0", None, 422, None, "dead_id"),
    ("dead letter unknown", "GET", f"{DL}/12345", None, 404, None, ""),
    ("replay id text", "POST", f"{DL}/abc/replay", None, 422, None, "dead_id"),
    ("replay unknown", "POST", f"{DL}/12345/replay", None, 404, None, ""),
    ("dead letters limit 0", "GET", f"{DL}?limit=0", None, 422, None, "limit"),
    ("dead letters limit 1001", "GET", f"{DL}?limit=1001", None, 422, None, "limit"),
    ("dead letters limit text", "GET", f"{DL}?limit=all", None, 422, None, "limit"),
    ("dead letters flag text", "GET", f"{DL}?include_replayed=maybe", None, 422, None, "include"),
    # -- instance events ---------------------------------------------------------------
    ("events limit 0", "GET", f"{EV}?limit=0", None, 422, None, "limit"),
    ("events limit 1001", "GET", f"{EV}?limit=1001", None, 422, None, "limit"),
    ("events limit text", "GET", f"{EV}?limit=many", None, 422, None, "limit"),
    ("events limit fraction", "GET", f"{EV}?limit=1.5", None, 422, None, "limit"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "slug", "field"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_bad_input_is_refused_and_changes_nothing(
    seeded: TestClient,
    db: Engine,
    method: str,
    path: str,
    body: Any,
    status: int,
    slug: str | None,
    field: str,
) -> None:
    before = snapshot(db)
    if isinstance(body, bytes):
        answer = seeded.request(
            method, path, content=body, headers={"content-type": "application/json"}
        )
    else:
        answer = seeded.request(method, path, json=body)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert problem["status"] == status
    assert problem["detail"]
    if slug is not None:
        assert problem["type"] == TYPE + slug, problem
    elif status == 422:
        assert problem["type"] in VALIDATION, problem
    else:
        assert problem["type"].startswith(TYPE), problem
    assert field in repr(problem), problem  # the problem names what is wrong
    assert snapshot(db) == before


def _counts(engine: Engine, task_id: str) -> tuple[int, int, int]:
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.scalar(select(func.count()).select_from(t).where(t.c.task_id == task_id))
            for t in (TaskRow.__table__, TaskEventRow.__table__, OutboxRow.__table__)
        )


def test_identical_resubmit_is_the_same_task_and_writes_nothing(
    seeded: TestClient, db: Engine
) -> None:
    before = snapshot(db)
    again = seeded.post("/v1/tasks", json=task(task_id=KNOWN))
    assert again.status_code == 200, again.text
    assert again.json()["task_id"] == KNOWN
    assert snapshot(db) == before


def _race(n: int, call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` from ``n`` threads released together."""
    start = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        start.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_duplicate_submits_make_exactly_one_task(seeded: TestClient, db: Engine) -> None:
    answers = _race(8, lambda _: seeded.post("/v1/tasks", json=task(task_id="t-race")))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 7 + [201], [a.text for a in answers]
    assert {a.json()["task_id"] for a in answers} == {"t-race"}
    assert _counts(db, "t-race") == (1, 1, 1)  # one task, one accepted event, one outbox


def test_concurrent_conflicting_submits_make_one_task_and_refuse_the_rest(
    seeded: TestClient, db: Engine
) -> None:
    def submit(i: int) -> Any:
        return seeded.post("/v1/tasks", json=task(task_id="t-clash", payload={"doc_id": f"{i}"}))

    answers = _race(6, submit)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [409] * 5, [a.text for a in answers]
    refused = [a.json() for a in answers if a.status_code == 409]
    assert {p["type"] for p in refused} == {TYPE + "task-conflict"}
    assert _counts(db, "t-clash") == (1, 1, 1)
    with db.connect() as conn:
        stored = conn.scalar(select(TaskRow.payload).where(TaskRow.task_id == "t-clash"))
    assert stored in [{"doc_id": f"{i}"} for i in range(6)]


# -- bodies that do not declare their length ---------------------------------------------


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    yield b'{"agent_id": "doc-analyzer-01", "method": "task.process", "payload": {"doc_id": "'
    sent = 0
    while sent < total:
        yield b"x" * size
        sent += size
    yield b'"}}'


@pytest.mark.parametrize(
    "path", ["/v1/tasks", "/v1/agents/register", "/v1/broadcasts", "/api/v1/dag-runs"]
)
def test_chunked_oversize_body_is_refused_in_process(
    seeded: TestClient, db: Engine, path: str
) -> None:
    before = snapshot(db)
    answer = seeded.post(
        path, content=_chunks(LIMIT + 1), headers={"content-type": "application/json"}
    )
    assert answer.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in answer.request.headers
    assert answer.status_code == 413, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert answer.json()["type"] == TYPE + "payload-too-large"
    assert snapshot(db) == before


def test_chunked_body_under_the_limit_is_accepted(seeded: TestClient) -> None:
    answer = seeded.post(
        "/v1/tasks", content=_chunks(10_000), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 201, answer.text


def _send_chunked(base: str, path: str, total: int) -> tuple[int, bytes]:
    """A raw HTTP/1.1 request whose body is chunked: (status, response head and body)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            sock.sendall(head.encode())
            for chunk in _chunks(total):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body went out
        received = b""
        while b"\r\n\r\n" not in received:
            part = sock.recv(65536)
            if not part:
                break
            received += part
    status = int(received.split(b" ", 2)[1]) if received else 0
    return status, received


def test_chunked_oversize_body_is_refused_by_the_server(hub_api: str, engine: Engine) -> None:
    before = snapshot(engine)
    status, received = _send_chunked(hub_api, "/v1/tasks", LIMIT * 4)
    assert status == 413, received[:500]
    assert PROBLEM.encode() in received
    assert snapshot(engine) == before
