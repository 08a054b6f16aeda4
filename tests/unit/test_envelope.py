"""The envelope rule, one definition for the SDK (wrapping returns) and delivery (reading)."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.delivery import envelope
from reach.core.delivery.retry import Outcome, classify


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"code": 0, "data": 1}, 0),
        ({"code": 0}, 0),
        ({"code": 7, "message": "no"}, 7),
        ({"code": -1}, -1),
        ({"code": True}, None),  # a bool is not an integer code
        ({"code": False}, None),
        ({"code": 1.0}, None),
        ({"code": "0"}, None),
        ({"code": None}, None),
        ({"data": 1}, None),
        ({}, None),
        ([{"code": 0}], None),
        ("code", None),
        (0, None),
        (None, None),
    ],
)
def test_code_of(body: object, code: int | None) -> None:
    assert envelope.code_of(body) == code


@pytest.mark.parametrize(
    ("value", "wrapped"),
    [
        ({"code": 0, "data": 5}, {"code": 0, "data": 5}),
        ({"code": 3, "message": "m"}, {"code": 3, "message": "m"}),
        ({"code": True}, {"code": 0, "data": {"code": True}}),
        ({"code": "3"}, {"code": 0, "data": {"code": "3"}}),
        ({"ok": 1}, {"code": 0, "data": {"ok": 1}}),
        ([1, 2], {"code": 0, "data": [1, 2]}),
        (None, {"code": 0, "data": None}),
        (0, {"code": 0, "data": 0}),
    ],
)
def test_wrap(value: Any, wrapped: dict[str, Any]) -> None:
    assert envelope.wrap(value) == wrapped


@pytest.mark.parametrize(
    "value", [{"ok": 1}, {"code": True}, {"code": 0, "data": 1}, {"code": 4}, None, [1], "s"]
)
def test_what_the_sdk_wraps_delivery_reads_the_same_way(value: Any) -> None:
    """A handler's return, wrapped by the SDK and sent with 200, is classified by the hub
    as success exactly when the SDK meant code 0."""
    wrapped = envelope.wrap(value)
    expected = Outcome.SUCCESS if wrapped["code"] == 0 else Outcome.BUSINESS_ERROR
    assert classify(200, wrapped) == expected
