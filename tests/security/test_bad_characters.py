"""Issue 37, item 17: NUL characters and non-JSON numbers get a clean 422 problem.

A NUL in an id, a query parameter or a body field reached the store (PostgreSQL text
cannot hold one: a 500, found by fuzzing ``/v1/match``), and a ``NaN`` in a payload gave a
500 whose log line quoted the payload. Both are now refused at the door with the 422
problem of the resource (``reach.hub.api.problems.InputGuardMiddleware``), on both stores,
and the log never holds the payload.

Real processes: ``reach api`` on a fresh store of each kind (one per module); requests
are made with raw bytes, as an attacker would send them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok

MARKER = "zz-payload-marker-7f3a"
PROBLEM = "application/problem+json"
TYPE = "urn:agent-reach:problem:"


@pytest.fixture(scope="module")
def api(
    shared_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """``reach api`` as its own process for the module: its base URL and its log."""
    home = tmp_path_factory.mktemp("api")
    port = free_port()
    log = home / "api.log"
    proc = HubProcess(["api", "--port", str(port)], hub_env(shared_store_url, home), log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base, log
    finally:
        proc.stop()


@pytest.fixture
def hub_api(api: tuple[str, Path]) -> str:
    return api[0]


def problem(r: requests.Response, slug: str) -> dict[str, object]:
    assert r.status_code == 422, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == TYPE + slug, body
    assert "\x00" not in r.text and "\\u0000" not in r.text  # never echoed
    return dict(body)


@pytest.mark.parametrize(
    ("path", "slug"),
    [
        ("/v1/tasks/t-%00x", "invalid-task-request"),
        ("/v1/tasks/t-%00x/events", "invalid-task-request"),
        ("/v1/sessions/s-%00", "invalid-request"),
        ("/api/v1/agents/a%00b", "invalid-request"),
        ("/api/v1/tasks?caller=key:%00", "invalid-query"),
        ("/api/v1/tasks?session_id=%00", "invalid-query"),
        ("/v1/match?intent=pay%00me", "invalid-task-request"),
        ("/v1/match?intent=pay&agent_id=%00", "invalid-task-request"),
        ("/api/v1/agents?tag=%00", "invalid-request"),
    ],
)
def test_a_nul_in_an_id_or_a_query_parameter_is_a_422(hub_api: str, path: str, slug: str) -> None:
    r = requests.get(hub_api + path, timeout=10)
    body = problem(r, slug)
    assert "NUL" in str(body["detail"])


BODIES = [
    (
        "/v1/tasks",
        b'{"agent_id": "a\\u0000b", "method": "m", "payload": {}}',
        "invalid-task-request",
        "body.agent_id",
    ),
    (
        "/v1/tasks",
        b'{"agent_id": "a", "method": "m", "payload": {"k": ["ok", "x\\u0000"]}}',
        "invalid-task-request",
        "body.payload.k[1]",
    ),
    (
        "/v1/tasks",
        b'{"agent_id": "a", "method": "m", "payload": {"k\\u0000": 1}}',
        "invalid-task-request",
        "body.payload (a key)",
    ),
    (
        "/v1/agents/register",
        b'{"agent_id": "x\\u0000", "instance_id": "i", "endpoint": "http://127.0.0.1:9"}',
        "invalid-request",
        "body.agent_id",
    ),
    (
        "/v1/sessions/s-1/close",
        b'{"reason": "bye\\u0000"}',
        "invalid-request",
        "body.reason",
    ),
]


@pytest.mark.parametrize(("path", "raw", "slug", "where"), BODIES)
def test_a_nul_in_a_body_field_is_a_422(
    hub_api: str, path: str, raw: bytes, slug: str, where: str
) -> None:
    r = requests.post(
        hub_api + path, data=raw, headers={"Content-Type": "application/json"}, timeout=10
    )
    body = problem(r, slug)
    assert body["detail"] == f"{where}: contains a NUL character"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_non_json_number_in_a_payload_is_a_422_and_never_logged(
    api: tuple[str, Path], constant: str
) -> None:
    hub_api, log = api
    raw = (
        '{"agent_id": "a", "method": "m", '
        f'"payload": {{"note": "{MARKER}", "amount": {constant}}}}}'
    ).encode()
    r = requests.post(
        hub_api + "/v1/tasks", data=raw, headers={"Content-Type": "application/json"}, timeout=10
    )
    body = problem(r, "invalid-task-request")
    assert constant.lstrip("-") in str(body["detail"])
    assert MARKER not in r.text
    assert MARKER not in log.read_text(errors="replace")


def test_a_nul_in_a_form_field_is_a_422(hub_api: str) -> None:
    r = requests.post(
        hub_api + "/ui/login",
        data=b"secret=abc%00def",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    problem(r, "invalid-request")


def test_ordinary_text_that_names_nan_or_escapes_passes(hub_api: str) -> None:
    """The guard parses only what looks suspicious, and refuses only what is wrong: the
    words NaN and Infinity in strings, and an escaped backslash, are fine."""
    raw = b'{"agent_id": "nobody-here", "method": "m", "payload": {"t": "NaN Infinity \\\\u0000"}}'
    r = requests.post(
        hub_api + "/v1/tasks", data=raw, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert r.status_code == 404, r.text  # through the guard, to routing: no such agent
    assert r.json()["type"] == TYPE + "no-suitable-agent"
