"""A capability's ``params_schema`` as a gate on payloads (``reach.core.fleet.params_schema``)."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.fleet.params_schema import payload_error, refusal

OBJECT_A = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("schema", "payload", "error"),
    [
        ({}, {"anything": [1, 2]}, None),  # no schema declared: every payload passes
        ({}, None, None),
        (OBJECT_A, {"a": 1}, None),
        (OBJECT_A, {}, "<payload>: "),
        (OBJECT_A, {"a": "x"}, "a: "),
        ({"type": "string", "pattern": "(?=x)"}, "x", "<schema>: "),  # cannot be used: closed
    ],
)  # fmt: skip
def test_payload_error(schema: dict[str, Any], payload: Any, error: str | None) -> None:
    found = payload_error(schema, payload)
    if error is None:
        assert found is None
    else:
        assert found is not None and found.startswith(error), found


@pytest.mark.parametrize(
    ("schema", "refused"),
    [
        ({}, False),
        (OBJECT_A, False),
        ({"$ref": "https://example.invalid/s.json"}, True),  # another document
        ({"type": "string", "pattern": "(a)\\1"}, True),  # a backreference
    ],
)  # fmt: skip
def test_refusal(schema: dict[str, Any], refused: bool) -> None:
    assert (refusal(schema) is not None) is refused
