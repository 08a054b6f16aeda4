"""The exception tree: stable slugs, HTTP statuses, and a lossless problem+json round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

import reach.errors as errors_module
from reach.errors import (
    PROBLEM_TYPE_PREFIX,
    BusinessError,
    CircuitOpen,
    HubUnavailable,
    ReachError,
    error_for_problem,
)


def _tree(cls: type[ReachError]) -> list[type[ReachError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_tree(sub))
    return found


# Only the classes defined in reach.errors: a test elsewhere that subclasses ReachError
# must not change this table.
ALL_ERRORS = [c for c in _tree(ReachError) if c.__module__ == "reach.errors"]
SUBCLASSES = [c for c in ALL_ERRORS if c is not ReachError]


def make(cls: type[ReachError], detail: str = "something broke", **extra: Any) -> ReachError:
    if cls is BusinessError:
        return BusinessError(7, detail, **extra)
    return cls(detail, **extra)


def test_the_tree_is_complete() -> None:
    """Every ReachError defined in the module is reachable from the root, and vice versa."""
    defined = {
        obj
        for obj in vars(errors_module).values()
        if isinstance(obj, type) and issubclass(obj, ReachError)
    }
    assert defined == set(ALL_ERRORS)
    assert len(SUBCLASSES) >= 20


def test_slugs_are_distinct() -> None:
    slugs = [c.slug for c in ALL_ERRORS]
    assert len(slugs) == len(set(slugs))


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_declares_its_own_identity(cls: type[ReachError]) -> None:
    own = vars(cls)
    if cls is not ReachError:
        assert "slug" in own, "a subclass must not inherit its parent's problem type"
        assert "title" in own
    assert cls.slug and cls.slug == cls.slug.lower() and " " not in cls.slug
    assert 400 <= cls.status <= 599
    doc = own.get("__doc__")
    assert doc and doc.strip() and "\n" not in doc.strip(), "one-line docstring"
    assert cls.problem_type() == PROBLEM_TYPE_PREFIX + cls.slug


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_problem_round_trip(cls: type[ReachError]) -> None:
    original = make(cls, key="server.port")
    problem = original.to_problem(instance="/v1/agents/register")
    assert problem["type"] == cls.problem_type()
    assert problem["status"] == cls.status
    assert problem["title"] == cls.title
    assert problem["detail"] == "something broke"
    assert problem["instance"] == "/v1/agents/register"
    assert problem["key"] == "server.port"

    # What the SDK sees is the JSON text, decoded.
    rebuilt = error_for_problem(json.loads(json.dumps(problem)), cls.status)
    assert type(rebuilt) is cls
    assert rebuilt.detail == "something broke"
    assert str(rebuilt) == "something broke"
    assert rebuilt.extra["key"] == "server.port"
    assert rebuilt.to_problem() == original.to_problem() | {"instance": "/v1/agents/register"}


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_round_trip_does_not_depend_on_the_http_status(cls: type[ReachError]) -> None:
    """The problem type decides the class, not the status line a proxy may have rewritten."""
    for status in (400, 500, 503):
        assert type(error_for_problem(make(cls).to_problem(), status)) is cls


@pytest.mark.parametrize(
    ("code", "message"),
    [(7, "x"), (1, "out of stock"), (-3, "negative codes too"), (42, "")],
)
def test_business_error_keeps_its_code(code: int, message: str) -> None:
    rebuilt = error_for_problem(BusinessError(code, message).to_problem(), 422)
    assert isinstance(rebuilt, BusinessError)
    assert rebuilt.code == code
    assert rebuilt.detail == (message or f"business error {code}")


def test_business_error_without_a_code_gets_code_1() -> None:
    problem = {"type": BusinessError.problem_type(), "detail": "no code"}
    rebuilt = error_for_problem(problem, 422)
    assert isinstance(rebuilt, BusinessError)
    assert rebuilt.code == 1


@pytest.mark.parametrize(
    ("problem", "status", "expected", "detail"),
    [
        ({"type": "urn:other:thing", "detail": "d"}, 500, HubUnavailable, "d"),
        ({"type": "urn:other:thing", "detail": "d"}, 502, HubUnavailable, "d"),
        ({}, 503, HubUnavailable, "HTTP 503"),
        ({"detail": "upstream timed out"}, 504, HubUnavailable, "upstream timed out"),
        ({"title": "Bad Gateway"}, 502, HubUnavailable, "Bad Gateway"),
        ({"type": "urn:other:thing", "detail": "d"}, 400, ReachError, "d"),
        ({}, 404, ReachError, "HTTP 404"),
        ({"detail": "nope", "hint": "x"}, 409, ReachError, "nope"),
        ({"type": PROBLEM_TYPE_PREFIX + "no-such-slug"}, 422, ReachError, "HTTP 422"),
    ],
)
def test_unknown_problem_type(
    problem: dict[str, Any], status: int, expected: type[ReachError], detail: str
) -> None:
    rebuilt = error_for_problem(problem, status)
    assert type(rebuilt) is expected
    assert rebuilt.detail == detail
    assert rebuilt.extra["status"] == status


def test_business_error_with_a_non_integer_code() -> None:
    problem = {"type": BusinessError.problem_type(), "detail": "d", "code": "E42"}
    assert isinstance(error_for_problem(problem, 422), ReachError)


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({"retry_after": 3}, {"Retry-After": "3"}),
        ({"retry_after": 2.2}, {"Retry-After": "3"}),  # whole seconds, rounded up
        ({"retry_after": 0}, {"Retry-After": "1"}),
        ({}, {}),
        ({"retry_after": "soon"}, {}),
    ],
)
def test_circuit_open_says_when_to_retry(extra: dict[str, Any], headers: dict[str, str]) -> None:
    error = CircuitOpen("every instance of a is open", **extra)
    assert (error.status, error.problem_type()) == (503, PROBLEM_TYPE_PREFIX + "circuit-open")
    assert error.headers() == headers
    rebuilt = error_for_problem(json.loads(json.dumps(error.to_problem())), 503)
    assert isinstance(rebuilt, CircuitOpen) and rebuilt.headers() == headers


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({}, {"Retry-After": "1"}),  # a database outage: come back soon
        ({"retry_after": 4.5}, {"Retry-After": "5"}),
    ],
)
def test_hub_unavailable_says_when_to_retry(extra: dict[str, Any], headers: dict[str, str]) -> None:
    error = HubUnavailable("the hub's database is unavailable", **extra)
    assert error.status == 503
    assert error.headers() == headers
