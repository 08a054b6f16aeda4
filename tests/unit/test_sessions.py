"""Session liveness decisions (``reach.core.gates.sessions``): state from row and clock, TTLs,
what closing cancels, who may see a session, the heartbeat header."""

from __future__ import annotations

import math

import pytest

from reach.core.gates.sessions import (
    CANCELLED_ON_CLOSE,
    IN_FLIGHT,
    SessionState,
    expiry,
    format_closed,
    may_bind,
    may_manage,
    may_read,
    parse_closed,
    resolve_ttl,
    state_of,
)
from reach.core.ledger.lifecycle import TaskEvent, sources_of
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.security.auth import OPEN, Principal, Scope
from reach.errors import InvalidTaskRequest


@pytest.mark.parametrize(
    ("status", "expires_at", "now", "state"),
    [
        (None, None, 100.0, SessionState.OPEN),  # never opened: implicitly open
        ("open", None, 1e12, SessionState.OPEN),  # no TTL: open until closed
        ("open", 150.0, 149.999, SessionState.OPEN),
        ("open", 150.0, 150.0, SessionState.EXPIRED),  # the TTL's end is already past
        ("open", 150.0, 151.0, SessionState.EXPIRED),
        ("closed", None, 100.0, SessionState.CLOSED),
        ("closed", 150.0, 200.0, SessionState.CLOSED),  # closed wins over expired
    ],
)
def test_state_of(
    status: str | None, expires_at: float | None, now: float, state: SessionState
) -> None:
    assert state_of(status, expires_at, now) is state
    assert state.alive is (state is SessionState.OPEN)


@pytest.mark.parametrize(
    ("ttl", "default", "maximum", "expected"),
    [
        (None, None, 100.0, None),  # no TTL anywhere: no expiry
        (None, 30.0, 100.0, 30.0),  # the default applies
        (10.0, 30.0, 100.0, 10.0),  # the request's wins
        (100.0, None, 100.0, 100.0),  # the maximum itself is allowed
        (0.5, None, 100.0, 0.5),
    ],
)
def test_resolve_ttl(
    ttl: float | None, default: float | None, maximum: float, expected: float | None
) -> None:
    assert resolve_ttl(ttl, default, maximum) == expected


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.inf, math.nan, 100.001, 1e9])
def test_resolve_ttl_refuses(ttl: float) -> None:
    with pytest.raises(InvalidTaskRequest) as caught:
        resolve_ttl(ttl, None, 100.0)
    assert caught.value.extra["field"] == "ttl_s"


@pytest.mark.parametrize(("now", "ttl", "expected"), [(10.0, None, None), (10.0, 5.0, 15.0)])
def test_expiry(now: float, ttl: float | None, expected: float | None) -> None:
    assert expiry(now, ttl) == expected


@pytest.mark.parametrize(
    ("status", "cancelled", "told"),
    [
        (TaskStatus.PENDING, True, False),  # queued: no agent has it yet
        (TaskStatus.AWAITING_APPROVAL, True, False),  # parked: nobody will decide it now
        (TaskStatus.DISPATCHING, False, True),  # being delivered: told, not killed
        (TaskStatus.EXECUTING, False, True),
        (TaskStatus.SUCCESS, False, False),
        (TaskStatus.FAILED, False, False),
        (TaskStatus.DEAD, False, False),
        (TaskStatus.CANCELLED, False, False),
    ],
)
def test_what_closing_touches(status: TaskStatus, cancelled: bool, told: bool) -> None:
    assert (status in CANCELLED_ON_CLOSE) is cancelled
    assert (status in IN_FLIGHT) is told
    if cancelled or told:
        assert status in sources_of(TaskEvent.CANCEL)  # the lifecycle allows it
    else:
        assert status in TERMINAL


CALLER = Principal(Scope.CALLER, key_id="aaaaaaaaaaaa", name="me")
OTHER = Principal(Scope.CALLER, key_id="bbbbbbbbbbbb", name="them")
ADMIN = Principal(Scope.ADMIN, key_id="cccccccccccc")
VIEWER = Principal(Scope.VIEWER, key_id="dddddddddddd")
AGENT = Principal(Scope.AGENT, key_id="eeeeeeeeeeee", agent_pattern="writer")
GLOB_AGENT = Principal(Scope.AGENT, key_id="ffffffffffff", agent_pattern="team-*")
MINE = "key:aaaaaaaaaaaa"


@pytest.mark.parametrize(
    ("principal", "owner", "manage", "read"),
    [
        (CALLER, MINE, True, True),
        (OTHER, MINE, False, False),  # not yours: answered as unknown
        (ADMIN, MINE, True, True),
        (OPEN, MINE, True, True),  # an open hub's anonymous principal is admin
        (VIEWER, MINE, False, True),  # viewers read everything, change nothing
        (AGENT, MINE, False, False),
        (AGENT, "agent:writer", True, True),  # an agent's own session (sent from a handler)
        (OTHER, None, False, False),
        (ADMIN, None, True, True),
    ],
)
def test_who_may(principal: Principal, owner: str | None, manage: bool, read: bool) -> None:
    assert may_manage(principal, owner) is manage
    assert may_read(principal, owner) is read


@pytest.mark.parametrize(
    ("principal", "owner", "handling", "bind"),
    [
        (CALLER, MINE, [], True),  # its owner
        (OTHER, MINE, [], False),  # another caller key: never (issue 37, item 6)
        (OTHER, MINE, ["writer"], False),  # a caller gets nothing from the routing
        (ADMIN, MINE, [], True),
        (OPEN, MINE, [], True),
        (VIEWER, MINE, [], False),
        (AGENT, MINE, [], False),  # an agent not handling any of its reaches
        (AGENT, MINE, ["writer"], True),  # its handler's onward reach inherits the session
        (AGENT, MINE, ["reader"], False),
        (GLOB_AGENT, MINE, ["team-7"], True),
        (AGENT, "agent:writer", [], True),  # its own session
        (OTHER, None, [], False),  # a session of no one's: an admin's to manage
    ],
)
def test_who_may_bind_a_reach(
    principal: Principal, owner: str | None, handling: list[str], bind: bool
) -> None:
    assert may_bind(principal, owner, handling) is bind


@pytest.mark.parametrize(
    ("principal", "agents", "read"),
    [
        (AGENT, ["writer"], True),  # a reach of it went to this agent: its handler may ask
        (AGENT, ["reader"], False),
        (GLOB_AGENT, ["reader", "team-7"], True),
        (OTHER, ["writer"], False),  # a caller key gets nothing from the routing
    ],
)
def test_agents_of_its_reaches_may_read(
    principal: Principal, agents: list[str], read: bool
) -> None:
    assert may_read(principal, MINE, agents) is read


@pytest.mark.parametrize(
    "ids",
    [
        [],
        ["s1"],
        ["s2", "s1"],
        ["with,comma", "with space", "ünï", "a/b", "%41"],
        ["dup", "dup"],
    ],
)
def test_closed_header_round_trips(ids: list[str]) -> None:
    value = format_closed(ids)
    assert value.isascii() and " " not in value  # a valid header value
    assert parse_closed(value) == frozenset(ids)


@pytest.mark.parametrize(
    ("value", "ids"),
    [(None, set()), ("", set()), ("s1, s2", {"s1", "s2"}), (",,s1,", {"s1"})],
)
def test_parse_closed(value: str | None, ids: set[str]) -> None:
    assert parse_closed(value) == ids


def test_header_is_sorted() -> None:
    assert format_closed(["b", "a", "c"]) == "a,b,c"
