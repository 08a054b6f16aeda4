"""Listing pages: cursors round-trip and refuse anything they did not issue; limits,
statuses, kinds and time bounds are checked with the offending parameter named."""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime

import pytest

from reach.core.ledger.statuses import DagRunStatus, TaskStatus
from reach.core.ops.paging import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    DagRunFilter,
    Page,
    Position,
    TaskFilter,
    check_limit,
    check_range,
    decode_cursor,
    decode_key_cursor,
    encode_cursor,
    encode_key_cursor,
    parse_choices,
    parse_instant,
    parse_statuses,
)
from reach.errors import BadCursor, InvalidQuery

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "position",
    [
        Position(0.0),
        Position(NOW, 0, 1),
        Position(1_790_000_000.123456789, 1, 2**40),
        Position(NOW + 0.1, 0, 7),  # a float that is not exact in binary still round-trips
    ],
)
def test_cursor_round_trips(position: Position) -> None:
    cursor = encode_cursor("tasks", position)
    assert decode_cursor("tasks", cursor) == position
    assert cursor.isascii() and "=" not in cursor and len(cursor) < 120


def _forged_body(items: list[object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(items).encode()).decode().rstrip("=")


GOOD = encode_cursor("tasks", Position(NOW, 0, 42))
BODY, CHECK = GOOD.split(".")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage",
        ".",
        "....",
        GOOD[:-1],  # cut
        GOOD + "0",  # lengthened
        BODY,  # no check
        f"{BODY}.{'0' * len(CHECK)}",  # a wrong check
        f"{_forged_body([1, 'tasks', NOW, 0, 41])}.{CHECK}",  # edited body, old check
        f"{BODY[:-2]}AA.{CHECK}",
        encode_cursor("dag-runs", Position(NOW, 0, 42)),  # another listing's
        "x" * 10_000,
        "\x00\x01",
        "é.é",
    ],
)
def test_a_cursor_not_issued_by_this_listing_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor) as refused:
        decode_cursor("tasks", cursor)
    assert refused.value.status == 400
    assert refused.value.problem_type() == "urn:agent-reach:problem:bad-cursor"


def test_bad_cursor_is_an_invalid_query() -> None:
    assert issubclass(BadCursor, InvalidQuery) and InvalidQuery.status == 422


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(None, DEFAULT_LIMIT), (1, 1), (50, 50), (MAX_LIMIT, MAX_LIMIT)],
)
def test_limit(limit: int | None, expected: int) -> None:
    assert check_limit(limit) == expected


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1, 10**12, True, 2.5, "10"])
def test_limit_out_of_range_is_refused(limit: object) -> None:
    with pytest.raises(InvalidQuery, match="limit"):
        check_limit(limit)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        (NOW, NOW),
        (0, 0.0),
        ("1800000000", NOW),
        ("1800000000.5", NOW + 0.5),
        ("90s", NOW - 90),
        ("15m", NOW - 900),
        ("2h", NOW - 7200),
        ("1.5h", NOW - 5400),
        ("7d", NOW - 7 * 86400),
        ("1w", NOW - 604800),
        ("2H", NOW - 7200),
        ("2027-01-15T08:00:00Z", datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()),
        ("2027-01-15T08:00:00+02:00", datetime(2027, 1, 15, 6, tzinfo=UTC).timestamp()),
        ("2027-01-15T08:00:00", datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()),  # UTC
        ("2027-01-15", datetime(2027, 1, 15, tzinfo=UTC).timestamp()),
    ],
)
def test_parse_instant(value: str | float | None, expected: float | None) -> None:
    assert parse_instant(value, NOW) == expected


@pytest.mark.parametrize(
    "value",
    ["yesterday", "15 minutes", "-5m", "nan", "inf", "-1", math.inf, math.nan, -3.0, "1e400"],
)
def test_parse_instant_refuses(value: str | float) -> None:
    with pytest.raises(InvalidQuery, match="until"):
        parse_instant(value, NOW, name="until")


@pytest.mark.parametrize(
    ("since", "until", "ok"),
    [
        (None, None, True),
        (1.0, None, True),
        (None, 1.0, True),
        (1.0, 2.0, True),
        (2.0, 2.0, False),
        (3.0, 2.0, False),
    ],
)
def test_range(since: float | None, until: float | None, ok: bool) -> None:
    if ok:
        check_range(since, until)
    else:
        with pytest.raises(InvalidQuery, match="since"):
            check_range(since, until)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, set()),
        ([], set()),
        ("failed", {TaskStatus.FAILED}),
        (["failed", "dead"], {TaskStatus.FAILED, TaskStatus.DEAD}),
        (["failed,dead", "failed"], {TaskStatus.FAILED, TaskStatus.DEAD}),
        (["FAILED ", ""], {TaskStatus.FAILED}),
        (["awaiting_approval"], {TaskStatus.AWAITING_APPROVAL}),
    ],
)
def test_task_statuses(values: list[str] | str | None, expected: set[TaskStatus]) -> None:
    assert parse_statuses(values, TaskStatus) == expected


@pytest.mark.parametrize(
    ("values", "enum"),
    [
        (["failed", "bogus"], TaskStatus),
        (["running"], TaskStatus),  # a DAG run's status, not a task's
        (["pending"], DagRunStatus),
        (["skipped"], DagRunStatus),  # a node's
    ],
)
def test_unknown_statuses_are_refused_with_the_known_ones(
    values: list[str], enum: type[TaskStatus] | type[DagRunStatus]
) -> None:
    with pytest.raises(InvalidQuery) as refused:
        parse_statuses(values, enum)
    assert "status" in refused.value.detail
    assert all(s.value in refused.value.detail for s in enum)


def test_choices() -> None:
    known = {"offline", "backpressure"}
    assert parse_choices(["offline,backpressure"], known, name="kind") == known
    with pytest.raises(InvalidQuery, match="kind: unknown kind 'x'"):
        parse_choices("x", known, name="kind")


def test_task_filter_parses_and_normalises() -> None:
    flt = TaskFilter.parse(
        NOW,
        status=["failed", "dead"],
        agent_id=" doc-analyzer-01 ",
        capability="",
        caller="key:abc",
        since="1h",
        until=str(NOW),
    )
    assert flt == TaskFilter(
        statuses=frozenset({TaskStatus.FAILED, TaskStatus.DEAD}),
        agent_id="doc-analyzer-01",
        caller="key:abc",
        since=NOW - 3600,
        until=NOW,
    )
    assert TaskFilter() == TaskFilter.parse(NOW)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"status": ["nope"]}, "status"),
        ({"since": "2h", "until": "3h"}, "since"),  # since after until
        ({"since": "soon"}, "since"),
        ({"until": "later"}, "until"),
        ({"agent_id": "a" * 300}, "agent_id"),
        ({"caller": "key:\x00"}, "caller"),  # PostgreSQL refuses NUL in text: never a 500
    ],
)
def test_task_filter_refuses(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidQuery, match=named):
        TaskFilter.parse(NOW, **kwargs)  # type: ignore[arg-type]


def test_filters_check_themselves_when_built_directly() -> None:
    with pytest.raises(InvalidQuery, match="status"):
        TaskFilter(statuses=frozenset({"bogus"}))  # type: ignore[arg-type]
    with pytest.raises(InvalidQuery, match="since"):
        DagRunFilter(since=5.0, until=1.0)
    with pytest.raises(InvalidQuery, match="until"):
        DagRunFilter(until=math.nan)
    assert DagRunFilter.parse(NOW, status="running", name="flow") == DagRunFilter(
        statuses=frozenset({DagRunStatus.RUNNING}), name="flow"
    )


def test_page_json() -> None:
    assert Page([{"a": 1}], "c").to_json() == {"items": [{"a": 1}], "next_cursor": "c"}
    assert Page([]).to_json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize("key", ["a", "agent-0042", "ünï/cödé", "x" * 128])
def test_key_cursor_round_trips(key: str) -> None:
    assert decode_key_cursor("agents", encode_key_cursor("agents", key)) == key


def _forged(payload: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"{body}.{_check_of('agents', body)}"


def _check_of(kind: str, body: str) -> str:
    import hashlib

    return hashlib.sha256(f"reach-cursor:{kind}:{body}".encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage",
        encode_key_cursor("agents", "a")[:-1] + "0",  # edited check
        encode_key_cursor("tasks", "a"),  # another listing's
        encode_cursor("agents", Position(1.0, 0, 1)),  # a time cursor, not a key cursor
        _forged([1, "agents", ""]),  # an empty key
        _forged([1, "agents", 7]),  # not a text key
        _forged([2, "agents", "a"]),  # another version
        "x" * 600,
    ],
)
def test_a_key_cursor_not_issued_by_this_listing_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor):
        decode_key_cursor("agents", cursor)
