"""The alert webhook's sends (``reach.hub.ops.alert_webhook.push``, what the beat's
``reach.alerts_push`` tick runs) and the admin's mutes (``/api/v1/alerts/mutes``), on
SQLite and PostgreSQL, against a real ``reach api`` process (API keys required) and a
real HTTP receiver on loopback.

A dead letter's alert reaches the receiver once, signed by the hub (verified with
``reach.verify_webhook`` against the api's JWKS); a receiver that is down is asked again
after a backoff and gets it once it is back; a muted kind is neither pushed nor listed
(``include_muted=true`` shows it, marked); only an admin key mutes, and each change is
audited; an unknown kind is 422 ``invalid-query``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

import reach
from reach.core.notify.outbound import SIGNATURE_HEADER
from reach.core.security.auth import Scope
from reach.hub.ops import alert_webhook
from reach.hub.security import apikeys
from reach.hub.security.sealing import SealKey
from reach.hub.settings import AlertSettings
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import AlertPushRow, AuditRow, DeadLetterRow
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok

PROBLEM = "urn:agent-reach:problem:"


class Receiver:
    """A webhook receiver on loopback that records each POST; may be stopped and started."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/alerts"
        self.got: list[tuple[dict[str, str], bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                got.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.allow_reuse_address = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]


@dataclass
class Hub:
    url: str
    home: Path
    engine: Engine
    db: sessionmaker[Session]
    admin: str
    viewer: str
    caller: str

    def call(self, method: str, path: str, key: str, **params: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return requests.request(method, self.url + path, params=params, headers=headers, timeout=10)


def _key(engine: Engine, scope: Scope) -> str:
    with Session(engine) as session, session.begin():
        created = apikeys.create_key(
            session, scope=scope, agent_pattern=None, name=f"test {scope.value}",
            expires_in_s=None, now=time.time(),
        )  # fmt: skip
        return created.secret


@pytest.fixture(scope="module")
def hub(shared_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    home = tmp_path_factory.mktemp("hub")
    env = hub_env(shared_store_url, home, REACH_SECURITY__REQUIRE_AUTH="true")
    port = free_port()
    proc = HubProcess(["api", "--port", str(port)], env, home / "api.log")
    engine = create_engine_for(shared_store_url)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", proc)
        yield Hub(
            url, home, engine, session_factory(engine),
            _key(engine, Scope.ADMIN), _key(engine, Scope.VIEWER), _key(engine, Scope.CALLER),
        )  # fmt: skip
    finally:
        proc.stop()
        engine.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    try:
        yield r
    finally:
        r.stop()


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _settings(receiver: Receiver) -> AlertSettings:
    return AlertSettings(
        webhook_url=receiver.url, webhook_allow_private=True, backoff_base_s=5, backoff_cap_s=5
    )


def _dead_letter(hub: Hub, task_id: str) -> int:
    with hub.db.begin() as session:
        row = DeadLetterRow(
            task_id=task_id, agent_id="alerting-agent", method="work.do", payload={"secret": 1},
            attempts=3, last_error={"kind": "connect"}, reason="retries spent",
            created_at=time.time(),
        )  # fmt: skip
        session.add(row)
        session.flush()
        return row.id


def _push(hub: Hub, receiver: Receiver, clock: Clock) -> alert_webhook.Pushed:
    seal = SealKey.load(None, hub.home)  # the hub's signing key is sealed with it
    return alert_webhook.push(hub.db, _settings(receiver), clock, seal=seal)


def _reset_marker(hub: Hub, receiver: Receiver, clock: Clock) -> None:
    """Each test starts the webhook anew: the marker at the newest records."""
    with hub.db.begin() as session:
        session.query(AlertPushRow).delete()
    assert "starts" in _push(hub, receiver, clock).detail


def test_a_dead_letter_is_pushed_once_signed_by_the_hub(hub: Hub, receiver: Receiver) -> None:
    clock = Clock()
    _reset_marker(hub, receiver, clock)
    assert _push(hub, receiver, clock).delivered == 0  # nothing new: nothing sent
    letter = _dead_letter(hub, "t-alert-1")
    pushed = _push(hub, receiver, clock)
    assert pushed.delivered == 1, pushed
    ((headers, body),) = receiver.got
    verified = reach.verify_webhook(body, headers[SIGNATURE_HEADER], hub=hub.url)
    assert verified["event"] == "alert" and verified["kind"] == "dead_letter"
    assert verified["alert_id"] == f"dead_letter:{letter}"
    assert verified["details"]["task_id"] == "t-alert-1"
    assert "secret" not in body.decode()  # never the payload
    with pytest.raises(reach.InvalidSignature):
        reach.verify_webhook(body.replace(b"t-alert-1", b"t-alert-2"), headers[SIGNATURE_HEADER],
                             hub=hub.url)  # fmt: skip
    assert _push(hub, receiver, clock).delivered == 0  # the marker moved past it
    assert len(receiver.got) == 1


def test_a_receiver_down_gets_the_alert_after_a_retry(hub: Hub, receiver: Receiver) -> None:
    clock = Clock()
    _reset_marker(hub, receiver, clock)
    receiver.stop()
    _dead_letter(hub, "t-alert-down")
    first = _push(hub, receiver, clock)
    assert first.delivered == 0 and "retry 1" in first.detail, first
    with hub.db.begin() as session:
        marker = session.get(AlertPushRow, 1)
        assert marker is not None and marker.attempts == 1 and marker.next_attempt_at
        assert marker.last_error and "no answer" in marker.last_error
    receiver.start()
    assert "not due" in _push(hub, receiver, clock).detail  # the backoff holds it back
    assert receiver.got == []
    clock.offset = 6.0
    assert _push(hub, receiver, clock).delivered == 1
    assert [b["details"]["task_id"] for b in receiver.bodies()] == ["t-alert-down"]
    assert _push(hub, receiver, clock).delivered == 0
    assert len(receiver.got) == 1


def test_a_muted_kind_is_not_pushed_nor_listed(hub: Hub, receiver: Receiver) -> None:
    clock = Clock()
    _reset_marker(hub, receiver, clock)
    muted = hub.call("PUT", "/api/v1/alerts/mutes/dead_letter", hub.admin)
    assert muted.status_code == 200, muted.text
    assert muted.json()["kind"] == "dead_letter" and muted.json()["muted"] is True
    try:
        mutes = hub.call("GET", "/api/v1/alerts/mutes", hub.viewer).json()["mutes"]
        assert [m["kind"] for m in mutes] == ["dead_letter"]
        letter = _dead_letter(hub, "t-alert-muted")
        pushed = _push(hub, receiver, clock)
        assert pushed.delivered == 0 and pushed.skipped == 1, pushed
        assert receiver.got == []
        listed = hub.call("GET", "/api/v1/alerts", hub.viewer, limit=500).json()["items"]
        assert all(item["kind"] != "dead_letter" for item in listed)
        shown = hub.call(
            "GET", "/api/v1/alerts", hub.viewer, kind="dead_letter", include_muted="true"
        ).json()["items"]
        mine = [a for a in shown if a["source_id"] == letter]
        assert len(mine) == 1 and mine[0]["muted"] is True
    finally:
        unmuted = hub.call("DELETE", "/api/v1/alerts/mutes/dead_letter", hub.admin)
        assert unmuted.status_code == 200 and unmuted.json() == {
            "kind": "dead_letter",
            "muted": False,
        }
    assert _push(hub, receiver, clock).delivered == 0  # passed over while muted: not sent now
    listed = hub.call("GET", "/api/v1/alerts", hub.viewer, kind="dead_letter").json()["items"]
    assert [a["muted"] for a in listed if a["source_id"] == letter] == [False]
    with hub.db.begin() as session:
        actions = session.scalars(
            select(AuditRow.action).where(AuditRow.target == "alert_kind:dead_letter")
        ).all()
    assert actions[-2:] == ["mute_alert_kind", "unmute_alert_kind"]


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_only_an_admin_mutes_and_an_unknown_kind_is_422(hub: Hub, method: str) -> None:
    for key in (hub.viewer, hub.caller):
        refused = hub.call(method, "/api/v1/alerts/mutes/offline", key)
        assert refused.status_code == 403, refused.text
        assert refused.json()["type"] == PROBLEM + "forbidden"
    assert hub.call("GET", "/api/v1/alerts/mutes", hub.caller).status_code == 403
    unknown = hub.call(method, "/api/v1/alerts/mutes/no_such_kind", hub.admin)
    assert unknown.status_code == 422, unknown.text
    assert unknown.headers["Content-Type"].startswith("application/problem+json")
    assert unknown.json()["type"] == PROBLEM + "invalid-query"
    listed = hub.call("GET", "/api/v1/alerts/mutes", hub.admin).json()["mutes"]
    assert "offline" not in [m["kind"] for m in listed]


def test_ids_reused_after_retention_deleted_the_newest_rows_are_still_pushed(
    hub: Hub, receiver: Receiver
) -> None:
    """SQLite gives a new row the highest id + 1: once the newest dead letters are deleted
    (retention), a new one may take an id the marker already passed."""
    clock = Clock()
    _reset_marker(hub, receiver, clock)
    _dead_letter(hub, "t-alert-old")
    assert _push(hub, receiver, clock).delivered == 1
    with hub.db.begin() as session:
        session.query(DeadLetterRow).delete()
    time.sleep(0.05)  # the next row is recorded after the last scan
    _dead_letter(hub, "t-alert-reused")
    assert _push(hub, receiver, clock).delivered == 1
    assert [b["details"]["task_id"] for b in receiver.bodies()] == ["t-alert-old", "t-alert-reused"]


def test_an_emptied_table_whose_next_row_takes_the_marks_own_id_is_still_pushed(
    hub: Hub, receiver: Receiver
) -> None:
    """The first dead letter of an empty table is id 1 on SQLite; deleted, the next one is
    id 1 again: the newest id equals the mark, and only the row's time tells it is new
    (CI: this test module's hub had no dead letter before the test above ran first)."""
    clock = Clock()
    with hub.db.begin() as session:
        session.query(DeadLetterRow).delete()
    _reset_marker(hub, receiver, clock)
    first = _dead_letter(hub, "t-alert-first")
    assert _push(hub, receiver, clock).delivered == 1
    with hub.db.begin() as session:
        session.query(DeadLetterRow).delete()
    time.sleep(0.05)  # the next row is recorded after the last scan
    again = _dead_letter(hub, "t-alert-again")
    if hub.db.kw["bind"].dialect.name == "sqlite":
        assert again == first  # the id the mark already passed
    assert _push(hub, receiver, clock).delivered == 1
    assert [b["details"]["task_id"] for b in receiver.bodies()] == [
        "t-alert-first",
        "t-alert-again",
    ]
    assert _push(hub, receiver, clock).delivered == 0  # and once
