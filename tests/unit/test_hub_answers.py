"""What the hub's answers become, for both clients: `answer` and `unavailable` are the
edge that ``HubClient`` (requests) and ``AsyncHubClient`` (aiohttp) share, so a refusal,
a malformed success or a failed exchange is the same typed error whichever met it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import reach
from reach.errors import HubUnavailable, ProtocolError, ReachError
from reach.sdk.aio_client import _query
from reach.sdk.hub_client import answer, unavailable

KEY = "rk_0123456789abcdef_" + "S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t"
PROBLEM = "urn:agent-reach:problem:"


def _problem(slug: str, **extra: Any) -> bytes:
    return json.dumps({"type": PROBLEM + slug, "title": "t", "detail": "said so", **extra}).encode()


def test_a_success_is_its_json_object() -> None:
    body = b'{"task_id": "t-1", "status": "pending", "more": 1}'
    got = answer(201, "application/json", body, ("task_id", "status"), "POST /v1/tasks", None)
    assert got == {"task_id": "t-1", "status": "pending", "more": 1}


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (404, _problem("unknown-task"), reach.UnknownTask),
        (409, _problem("session-closed", session_id="s-1"), reach.SessionClosed),
        (422, _problem("invalid-payload"), reach.InvalidPayload),
        (429, _problem("backpressure", depth=3, limit=3), reach.Backpressure),
        (502, b"<html>bad gateway</html>", HubUnavailable),  # a 5xx page: the hub is down
        (401, b"<html>401 Authorization Required</html>", reach.Unauthenticated),
        (403, b"", reach.Forbidden),
        (418, b"teapot", ReachError),
    ],
)
def test_a_refusal_is_its_typed_error(status: int, body: bytes, kind: type[ReachError]) -> None:
    with pytest.raises(ReachError) as caught:
        answer(status, "application/problem+json", body, (), "GET /x", None)
    assert type(caught.value) is kind


def test_a_refusal_that_echoes_the_key_is_scrubbed() -> None:
    body = _problem("unauthenticated", errors=[{"msg": f"got {KEY}"}]).replace(
        b"said so", f"invalid API key {KEY}".encode()
    )
    with pytest.raises(reach.Unauthenticated) as caught:
        answer(401, "application/problem+json", body, (), "GET /x", KEY)
    assert KEY not in str(caught.value) and KEY not in repr(caught.value.extra)
    assert "rk_0123456789abcdef_…" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "kind", "said"),
    [
        (b"<html>Welcome to nginx!</html>", "text/html", "not JSON: '<html>Welcome"),
        (b"", None, "(no content type) with a body that is not JSON"),
        (b"\xff\xfe\x00", "application/json", "not JSON"),
        (b"[1, 2]", "application/json", "JSON list, not an object"),
        (b'{"task_id": "t-1"}', "application/json", "without status"),
    ],
)
def test_a_success_without_the_promised_object_is_a_protocol_error(
    body: bytes, kind: str | None, said: str
) -> None:
    with pytest.raises(ProtocolError, match="POST http://hub/v1/tasks answered 200") as caught:
        answer(200, kind, body, ("task_id", "status"), "POST http://hub/v1/tasks", None)
    assert said in str(caught.value)
    assert caught.value.extra["http_status"] == 200
    assert isinstance(caught.value, HubUnavailable)  # retryable, like an outage


@pytest.mark.parametrize(
    ("exc", "timed_out", "said"),
    [
        (ConnectionRefusedError("connect refused"), False, "is unreachable: connect refused"),
        (TimeoutError(), True, "did not answer in time: TimeoutError"),  # no text of its own
    ],
)
def test_a_failed_exchange_is_hub_unavailable_with_its_cause(
    exc: BaseException, timed_out: bool, said: str
) -> None:
    error, cause = unavailable("http://hub:8800", exc, timed_out=timed_out, api_key=KEY)
    assert isinstance(error, HubUnavailable)
    assert str(error) == f"hub at http://hub:8800 {said}"
    assert cause is exc


def test_a_failure_whose_text_holds_the_key_is_redacted_and_not_chained() -> None:
    exc = ValueError(f"bad header Bearer {KEY}")
    error, cause = unavailable("http://hub:8800", exc, timed_out=False, api_key=KEY)
    assert KEY not in str(error) and "Bearer rk_0123456789abcdef_…" in str(error)
    assert cause is None  # a traceback would show the cause's text


@pytest.mark.parametrize(
    ("params", "pairs"),
    [
        (None, None),
        ({"wait": 29.5}, [("wait", "29.5")]),
        (
            {"intent": "a b", "tag": ["x", "y"], "limit": 5},
            [("intent", "a b"), ("tag", "x"), ("tag", "y"), ("limit", "5")],
        ),
    ],
)
def test_a_query_is_encoded_as_requests_encodes_it(
    params: dict[str, Any] | None, pairs: list[tuple[str, str]] | None
) -> None:
    assert _query(params) == pairs
