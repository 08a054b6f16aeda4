"""The runner's decisions, as tables: how long a delivery waits before its 202, how often a
run answered 202 keeps the hub's watchdog off, and what a handler's value is answered."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

import reach
from reach.sdk.running import Delivery, accept_wait, keepalive_interval, outcome

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("accept_after", "deadline", "expected"),
    [
        (10.0, None, 10.0),  # no deadline: accept_after
        (10.0, NOW + 30, 10.0),  # the hub's default 30 s: 10 s
        (10.0, NOW + 12, 6.0),  # half the time left, when sooner
        (10.0, NOW + 1, 0.5),
        (10.0, NOW - 5, 0.0),  # already late: 202 at once unless done
        (0.0, NOW + 30, 0.0),
        (None, NOW + 30, None),  # always answer when the handler ends
        (None, None, None),
    ],
)
def test_accept_wait(
    accept_after: float | None, deadline: float | None, expected: float | None
) -> None:
    assert accept_wait(accept_after, deadline, NOW) == expected


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(30.0, 10.0), (90.0, 10.0), (12.0, 4.0), (3.0, 1.0), (1.0, 1.0), (0.05, 1.0), (-3.0, 1.0)],
)
def test_keepalive_interval(budget: float, expected: float) -> None:
    assert keepalive_interval(budget) == expected


def test_a_delivery_budget_is_its_deadline_less_its_arrival() -> None:
    body: dict[str, Any] = {"task_id": "t", "payload": {}, "attempt_seq": 3, "deadline": NOW + 30}
    d = Delivery.of("m", body, NOW)
    assert (d.attempt_seq, d.budget, d.deadline) == (3, 30.0, NOW + 30)
    for bad in (None, True, "soon", math.nan, math.inf):
        d = Delivery.of("m", {**body, "deadline": bad, "attempt_seq": True}, NOW)
        assert (d.deadline, d.budget, d.attempt_seq) == (None, 30.0, None)


class Thing:
    pass


async def _coroutine() -> int:
    return 1


def _generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            _coroutine,
            "handler for 'think' returned a coroutine, which is not JSON "
            "(did you mean async def + await?)",
        ),
        (_generator, "handler for 'think' returned a generator, which is not JSON"),
        (Thing, "handler for 'think' returned a Thing, which is not JSON"),
        (object, "handler for 'think' returned an object, which is not JSON"),
        (lambda: {1, 2}, "handler for 'think' returned a set, which is not JSON"),
        (lambda: b"raw", "handler for 'think' returned a bytes, which is not JSON"),
        (lambda: math.nan, "handler for 'think' returned a float, which is not JSON"),
        (lambda: [math.inf], "handler for 'think' returned a list, which is not JSON"),
        (lambda: {"x": {1}}, "handler for 'think' returned a dict, which is not JSON"),
        (
            lambda: {"code": 3, "message": b"x"},
            "handler for 'think' returned a dict, which is not JSON",
        ),
    ],
)
def test_a_value_that_is_not_json_fails_the_attempt(make: Any, message: str) -> None:
    value = make()
    try:
        (status, body), failed = outcome("think", value)
    finally:
        if hasattr(value, "close"):
            value.close()
    assert failed and status == 500 and body["code"] == -1
    assert body["message"].startswith(message), body


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"ok": True}, (200, {"code": 0, "data": {"ok": True}})),
        (None, (200, {"code": 0, "data": None})),
        (1.5, (200, {"code": 0, "data": 1.5})),
        ({"code": 7, "message": "no"}, (200, {"code": 7, "message": "no"})),
        (reach.ACCEPTED, (202, {"code": 0, "accepted": True})),
    ],
)
def test_json_values_are_answered(value: Any, expected: tuple[int, dict[str, Any]]) -> None:
    assert outcome("m", value) == (expected, False)
