"""Callbacks through real processes (api, worker, beat, a progress-reporting agent, and a
receiver process on loopback that journals every POST) on SQLite and PostgreSQL.

The result is POSTed once, signed by the hub (``reach.verify_callback`` against the hub's
JWKS; the same body is refused as an approval webhook, and an altered one is refused),
with the caller's ``callback_context``; progress too when asked. A receiver failing the
first N times gets it after retries with the same ``callback_id``; one that never
answers ends dead-lettered (stored, counted). Without ``callbacks.allow_private`` a
loopback, private or link-local URL is refused at submit and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select

import reach
from reach.hub.storage import create_engine_for
from reach.hub.storage.models import CallbackRow, TaskRow
from tests.support.callback_receiver import CallbackReceiverProcess
from tests.support.ports import free_port
from tests.support.progress_agent import ProgressAgentProcess
from tests.support.stacks import HubProcess, Stack, hub_env, wait_http_ok
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_CALLBACKS__ALLOW_PRIVATE": "true",
    "REACH_CALLBACKS__BACKOFF_BASE_S": "0.2",
    "REACH_CALLBACKS__BACKOFF_CAP_S": "0.5",
    "REACH_CALLBACKS__MAX_RETRIES": "3",
    "REACH_CALLBACKS__TIMEOUT_S": "2",
}
PROBLEM = "urn:agent-reach:problem:"


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CallbackReceiverProcess]:
    port = free_port()
    proc = CallbackReceiverProcess(port, tmp_path_factory.mktemp("receiver") / "journal.jsonl")
    try:
        wait_until(lambda: _listening(port), timeout=20, what="receiver")
        yield proc
    finally:
        proc.stop()


def _listening(port: int) -> bool:
    try:
        requests.post(f"http://127.0.0.1:{port}/ok/probe", timeout=1)
    except requests.RequestException:
        return False
    return True


@pytest.fixture(scope="module")
def agent(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    log = tmp_path_factory.mktemp("agent") / "progress.log"
    proc = ProgressAgentProcess(shared_stack.url, log, free_port())
    try:
        wait_until(lambda: shared_stack.instances("progress"), timeout=30, what="agent")
        yield
    finally:
        proc.stop()


def _jwks(stack: Stack) -> dict[str, Any]:
    return dict(requests.get(f"{stack.url}/.well-known/jwks.json", timeout=5).json())


def _callbacks(stack: Stack, task_id: str) -> list[CallbackRow]:
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(CallbackRow).where(CallbackRow.task_id == task_id).order_by(CallbackRow.id)
            ).all()
            return list(rows)  # type: ignore[arg-type]
    finally:
        engine.dispose()


def test_the_result_is_posted_once_signed_with_the_callers_context(
    shared_stack: Stack, agent: None, receiver: CallbackReceiverProcess
) -> None:
    path = f"/ok/{free_port()}"
    context = {"session_fragment": ["turn 1", "turn 2"], "n": 3}
    sub = reach.send(
        agent_id="progress",
        method="work.do",
        payload={"steps": 2, "interval": 0.05},
        hub=shared_stack.url,
        callback_url=receiver.url + path,
        callback_context=context,
    )
    got = wait_until(lambda: receiver.requests(path), timeout=30, what="the callback")
    reach.wait_for_result(sub.task_id, timeout=10, hub=shared_stack.url)
    record = got[0]
    headers = {k.lower(): v for k, v in record["headers"].items()}
    body = reach.verify_callback(record["body"], headers["reach-signature"], _jwks(shared_stack))
    assert body["event"] == "task_result"
    assert body["task_id"] == sub.task_id and body["status"] == "success"
    assert body["result"] == {"steps": 2, "by": "progress"}
    assert body["context"] == context
    assert headers["reach-callback-id"] == str(body["callback_id"])
    # a callback is not a webhook: its signature is refused by the webhook check
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(record["body"], headers["reach-signature"], _jwks(shared_stack))
    # and an altered body is refused
    with pytest.raises(reach.InvalidSignature):
        reach.verify_callback(
            record["body"].replace(b"success", b"failed!"),
            headers["reach-signature"],
            _jwks(shared_stack),
        )
    # the hub's URL works in place of the key set
    assert reach.verify_callback(record["body"], headers["reach-signature"], hub=shared_stack.url)
    # once: no second POST of the result, and the record says delivered
    wait_until(
        lambda: _callbacks(shared_stack, sub.task_id)[0].status == "delivered",
        timeout=10,
        what="delivered",
    )
    assert len(receiver.requests(path)) == 1
    row = _callbacks(shared_stack, sub.task_id)[0]
    assert row.attempts == 1 and row.delivered_at is not None and row.last_error is None


def test_progress_is_posted_when_asked(
    shared_stack: Stack, agent: None, receiver: CallbackReceiverProcess
) -> None:
    path = f"/ok/{free_port()}"
    sub = reach.send(
        agent_id="progress",
        method="work.do",
        payload={"steps": 3, "interval": 0.05},
        hub=shared_stack.url,
        callback_url=receiver.url + path,
        callback_context="ctx-7",
        callback_progress=True,
    )
    jwks = _jwks(shared_stack)

    def bodies() -> list[dict[str, Any]]:
        return [
            reach.verify_callback(r["body"], r["headers"]["Reach-Signature"], jwks)
            for r in receiver.requests(path)
        ]

    wait_until(lambda: len(bodies()) >= 4, timeout=30, what="3 progress + result")
    got = bodies()
    progress = [b for b in got if b["event"] == "task_progress"]
    assert sorted(b["progress"]["message"] for b in progress) == ["step 1", "step 2", "step 3"]
    assert all(b["context"] == "ctx-7" and b["task_id"] == sub.task_id for b in progress)
    assert [b["event"] for b in got].count("task_result") == 1


def test_a_failing_receiver_gets_it_after_retries_with_the_same_id(
    shared_stack: Stack, agent: None, receiver: CallbackReceiverProcess
) -> None:
    path = f"/fail/2/{free_port()}"  # 503 twice, then 204
    sub = reach.send(
        agent_id="progress",
        method="work.do",
        payload={"steps": 1, "interval": 0.05},
        hub=shared_stack.url,
        callback_url=receiver.url + path,
    )
    wait_until(
        lambda: [r["answered"] for r in receiver.requests(path)] == [503, 503, 204],
        timeout=30,
        what="two failures, then delivered",
    )
    ids = {r["headers"]["Reach-Callback-Id"] for r in receiver.requests(path)}
    assert len(ids) == 1  # the receiver can drop repeats by id
    wait_until(
        lambda: _callbacks(shared_stack, sub.task_id)[0].status == "delivered",
        timeout=10,
        what="delivered",
    )
    assert _callbacks(shared_stack, sub.task_id)[0].attempts == 3


def test_a_receiver_that_never_answers_ends_dead_lettered(shared_stack: Stack, agent: None) -> None:
    closed = f"http://127.0.0.1:{free_port()}/nobody"
    sub = reach.send(
        agent_id="progress",
        method="work.do",
        payload={"steps": 1, "interval": 0.05},
        hub=shared_stack.url,
        callback_url=closed,
    )
    assert reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url).data
    row = wait_until(
        lambda: next(
            (r for r in _callbacks(shared_stack, sub.task_id) if r.status == "dead"), None
        ),
        timeout=60,
        what="dead-lettered",
    )
    assert row.attempts == 4  # the first POST and callbacks.max_retries = 3 retries
    assert row.last_error and "no answer" in row.last_error
    assert 'agentreach_callbacks_total{outcome="dead"}' in shared_stack.metrics()
    assert "ALERT callback" in shared_stack.worker.output()
    # the task itself is untouched by its callback's fate
    assert shared_stack.task(sub.task_id)["status"] == "success"


def test_the_record_is_written_with_the_terminal_state(shared_stack: Stack, agent: None) -> None:
    """The result row is armed in the terminal transaction: a task that ended has a due,
    delivered or dead callback, never a waiting one."""
    sub = reach.send(
        agent_id="progress",
        method="work.do",
        payload={"steps": 1, "interval": 0.05},
        hub=shared_stack.url,
        callback_url=f"http://127.0.0.1:{free_port()}/x",
    )
    reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url)
    engine = create_engine_for(shared_stack.env["REACH_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            status = conn.execute(
                select(TaskRow.status, TaskRow.callback_url).where(TaskRow.task_id == sub.task_id)
            ).one()
            rows = conn.execute(
                select(CallbackRow.status, CallbackRow.kind).where(
                    CallbackRow.task_id == sub.task_id
                )
            ).all()
    finally:
        engine.dispose()
    assert status.status == "success" and status.callback_url.endswith("/x")
    assert [r.kind for r in rows] == ["result"]
    assert rows[0].status in ("due", "delivered", "dead")


REFUSED = [
    ("http://127.0.0.1:9/cb", "loopback"),
    ("http://localhost:9/cb", "loopback"),
    ("http://10.1.2.3/cb", "private"),
    ("http://192.168.1.1/cb", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[::1]:9/cb", "loopback"),
    ("ftp://example.com/cb", "http(s)"),
    ("http://user:pw@example.com/cb", "credentials"),
    ("not a url", "http(s)"),
]


def test_private_and_invalid_urls_are_refused_at_submit(hub_api: str, store_url: str) -> None:
    for url, rule in REFUSED:
        r = requests.post(
            f"{hub_api}/v1/tasks",
            json={"agent_id": "anyone", "method": "work.do", "callback_url": url},
            timeout=10,
        )
        assert r.status_code == 422, (url, r.text)
        problem = r.json()
        assert r.headers["content-type"].startswith("application/problem+json")
        assert problem["type"] == PROBLEM + "callback-refused", url
        assert rule in problem["rule"] and rule in problem["detail"], (url, problem)
    # nothing written
    engine = create_engine_for(store_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(TaskRow.task_id)).all() == []
            assert conn.execute(select(CallbackRow.id)).all() == []
    finally:
        engine.dispose()


def test_the_sdk_raises_the_typed_refusal(hub_api: str) -> None:
    with pytest.raises(reach.CallbackRefused) as caught:
        reach.send(
            agent_id="anyone", method="work.do", hub=hub_api, callback_url="http://127.0.0.1/cb"
        )
    assert "loopback" in str(caught.value)


MALFORMED = [
    {"callback_context": {"a": 1}},  # context without a URL
    {"callback_progress": True},
    {"callback_url": "http://example.com/" + "x" * 600},
    {"callback_url": "http://example.com/cb", "callback_context": "x" * 20_000},
    {"callback_url": 7},
]


def test_malformed_callback_fields_are_422(hub_api: str) -> None:
    for body in MALFORMED:
        r = requests.post(
            f"{hub_api}/v1/tasks",
            json={"agent_id": "anyone", "method": "work.do", **body},
            timeout=10,
        )
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")


def test_a_private_url_is_accepted_when_allowed(tmp_path: Path, store_url: str) -> None:
    """The same loopback URL passes the guard with ``callbacks.allow_private`` (the stack
    above runs so); the refusal is the setting's, not the URL's shape."""
    port = free_port()
    env = hub_env(store_url, tmp_path, REACH_CALLBACKS__ALLOW_PRIVATE="true")
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", api)
        r = requests.post(
            f"http://127.0.0.1:{port}/v1/tasks",
            json={"agent_id": "anyone", "method": "work.do", "callback_url": "http://127.0.0.1/cb"},
            timeout=10,
        )
        assert r.json()["type"] != PROBLEM + "callback-refused", r.text
    finally:
        api.stop()
