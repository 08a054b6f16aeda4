"""The permission table of `reach.core.security.auth`: scopes x actions, agent patterns,
ownership of
tasks, when auth is required, and the shapes of credentials. Pure: no store, no sockets."""

from __future__ import annotations

import pytest

from reach.core.security.auth import (
    OPEN,
    Action,
    Principal,
    Scope,
    auth_required,
    bearer_of,
    digest,
    is_loopback_host,
    key_refusal,
    may_act_for,
    may_cancel_task,
    may_read_task,
    new_key_id,
    new_secret,
    parse_secret,
    permits,
    secret_matches,
)

A, C, G, V, P = Scope.ADMIN, Scope.CALLER, Scope.AGENT, Scope.VIEWER, Scope.APPROVER

# (scope, action, permitted)
TABLE = [
    (A, Action.ACT_AS_AGENT, True),
    (A, Action.REPORT, True),
    (A, Action.SUBMIT, True),
    (A, Action.READ_TASK, True),
    (A, Action.READ_FLEET, True),
    (A, Action.ADMINISTER, True),
    (A, Action.APPROVE, True),
    (A, Action.READ_APPROVALS, True),
    (C, Action.ACT_AS_AGENT, False),
    (C, Action.REPORT, False),
    (C, Action.SUBMIT, True),
    (C, Action.READ_TASK, True),
    (C, Action.READ_FLEET, False),
    (C, Action.ADMINISTER, False),
    (C, Action.APPROVE, False),
    (C, Action.READ_APPROVALS, False),
    (G, Action.ACT_AS_AGENT, True),
    (G, Action.REPORT, True),
    (G, Action.SUBMIT, True),
    (G, Action.READ_TASK, True),
    (G, Action.READ_FLEET, False),
    (G, Action.ADMINISTER, False),
    (G, Action.APPROVE, False),
    (G, Action.READ_APPROVALS, False),
    (V, Action.ACT_AS_AGENT, False),
    (V, Action.REPORT, False),
    (V, Action.SUBMIT, False),
    (V, Action.READ_TASK, True),
    (V, Action.READ_FLEET, True),
    (V, Action.ADMINISTER, False),
    (V, Action.APPROVE, False),
    (V, Action.READ_APPROVALS, True),
    (P, Action.ACT_AS_AGENT, False),
    (P, Action.REPORT, False),
    (P, Action.SUBMIT, False),
    (P, Action.READ_TASK, False),
    (P, Action.READ_FLEET, False),
    (P, Action.ADMINISTER, False),
    (P, Action.APPROVE, True),
    (P, Action.READ_APPROVALS, True),
]


def test_the_table_covers_every_scope_and_action() -> None:
    assert {(s, a) for s, a, _ in TABLE} == {(s, a) for s in Scope for a in Action}


@pytest.mark.parametrize(("scope", "action", "allowed"), TABLE)
def test_scope_permits_action(scope: Scope, action: Action, allowed: bool) -> None:
    assert permits(Principal(scope, key_id="k1"), action) is allowed


def test_an_open_hub_lets_anyone_do_anything() -> None:
    assert OPEN.anonymous and OPEN.identity == "anonymous"
    assert all(permits(OPEN, a) for a in Action)
    assert may_act_for(OPEN, "any-agent")


def agent_key(pattern: str | None) -> Principal:
    return Principal(Scope.AGENT, key_id="kagent", agent_pattern=pattern)


@pytest.mark.parametrize(
    ("principal", "agent_id", "allowed"),
    [
        (agent_key("a-*"), "a-1", True),
        (agent_key("a-*"), "a-", True),
        (agent_key("a-*"), "b", False),
        (agent_key("a-*"), "A-1", False),  # case-sensitive
        (agent_key("a-*"), "xa-1", False),  # anchored at the start
        (agent_key("b"), "b", True),
        (agent_key("b"), "b2", False),
        (agent_key("a-?"), "a-1", True),
        (agent_key("a-?"), "a-12", False),
        (agent_key("[ab]-1"), "b-1", True),
        (agent_key(None), "a-1", False),  # an agent key without a pattern speaks for none
        (agent_key(""), "a-1", False),
        (Principal(Scope.ADMIN, key_id="kadm"), "anything", True),
        (Principal(Scope.CALLER, key_id="kc"), "a-1", False),
        (Principal(Scope.VIEWER, key_id="kv"), "a-1", False),
        (Principal(Scope.CALLER, key_id="kc", agent_pattern="*"), "a-1", False),
    ],
)
def test_who_may_act_for_an_agent(principal: Principal, agent_id: str, allowed: bool) -> None:
    assert may_act_for(principal, agent_id) is allowed


@pytest.mark.parametrize(
    ("principal", "identity"),
    [
        (Principal(Scope.CALLER, key_id="abc"), "key:abc"),
        (Principal(Scope.ADMIN, key_id="abc"), "key:abc"),
        (agent_key("planner"), "agent:planner"),  # one agent: that agent
        (agent_key("a-*"), "key:kagent"),  # a glob: the key, until it acts as one
        (agent_key("a-*").acting_as("a-1"), "agent:a-1"),
        (agent_key("a-*").acting_as("b"), "key:kagent"),  # not covered: unchanged
        (agent_key("a-*").acting_as(None), "key:kagent"),
        (Principal(Scope.CALLER, key_id="abc").acting_as("a-1"), "key:abc"),  # callers never
        (Principal(Scope.ADMIN, key_id="abc").acting_as("a-1"), "key:abc"),
        (OPEN, "anonymous"),
    ],
)
def test_identity(principal: Principal, identity: str) -> None:
    assert principal.identity == identity


CALLER = Principal(Scope.CALLER, key_id="c1")


@pytest.mark.parametrize(
    ("principal", "caller", "agent_id", "allowed"),
    [
        (Principal(Scope.ADMIN, key_id="x"), "key:other", "b", True),
        (Principal(Scope.VIEWER, key_id="x"), "key:other", "b", True),
        (CALLER, "key:c1", "b", True),
        (CALLER, "key:c2", "b", False),
        (CALLER, None, "b", False),
        (CALLER, "anonymous", None, False),
        (agent_key("a-*"), "key:kagent", None, True),  # what the key itself sent
        (agent_key("a-*"), "agent:a-1", None, True),  # what one of its agents sent
        (agent_key("a-*"), "agent:b", None, False),
        (agent_key("a-*"), "key:c1", "a-2", True),  # delivered to one of its agents
        (agent_key("a-*"), "key:c1", "b", False),
        (agent_key("a-*"), "key:c1", None, False),
        (agent_key("planner"), "agent:planner", None, True),
        (agent_key("a-*").acting_as("a-1"), "key:kagent", None, True),
        (OPEN, "key:c1", "b", True),
    ],
)
def test_who_may_read_a_task(
    principal: Principal, caller: str | None, agent_id: str | None, allowed: bool
) -> None:
    assert may_read_task(principal, caller, agent_id) is allowed


@pytest.mark.parametrize(
    ("setting", "host", "required"),
    [
        (None, "127.0.0.1", False),
        (None, "127.0.0.2", False),
        (None, "localhost", False),
        (None, "LOCALHOST", False),
        (None, "::1", False),
        (None, "[::1]", False),
        (None, "0.0.0.0", True),
        (None, "::", True),
        (None, "10.0.0.5", True),
        (None, "hub.example.com", True),
        (None, "", True),
        (True, "127.0.0.1", True),  # set explicitly: the setting wins
        (False, "0.0.0.0", False),
    ],
)
def test_auth_required_by_bind_address(setting: bool | None, host: str, required: bool) -> None:
    assert auth_required(setting, host) is required
    if setting is None:
        assert is_loopback_host(host) is not required


@pytest.mark.parametrize(
    ("header", "credential"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Bearer    ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("garbage", None),
        ("Token abc", None),
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER abc", "abc"),
        ("  Bearer abc  ", "abc"),
        ("Bearer rk_0123456789abcdef_x", "rk_0123456789abcdef_x"),
    ],
)
def test_bearer_of(header: str | None, credential: str | None) -> None:
    assert bearer_of(header) == credential


GOOD = "rk_0123456789abcdef_" + "A" * 43


@pytest.mark.parametrize(
    ("secret", "key_id"),
    [
        (GOOD, "0123456789abcdef"),
        ("rk_0123456789ab_" + "x-_Y" * 5, "0123456789ab"),  # shortest id and random part
        ("rk_0123456789a_" + "A" * 43, None),  # id too short
        ("rk_0123456789ABCDEF_" + "A" * 43, None),  # ids are lower-case hex/alnum
        ("rk_0123456789abcdef_" + "A" * 19, None),  # random part too short
        ("rk_0123456789abcdef_" + "A" * 129, None),  # too long
        ("rk_0123456789abcdef_" + "A" * 42 + "!", None),
        ("xx_0123456789abcdef_" + "A" * 43, None),
        ("0123456789abcdef_" + "A" * 43, None),
        (GOOD + "\n", None),
        (" " + GOOD, None),
        ("", None),
        ("garbage", None),
        ("eyJhbGciOiJFZERTQSJ9.e30.sig", None),  # a JWT is not an API key
    ],
)
def test_parse_secret(secret: str, key_id: str | None) -> None:
    assert parse_secret(secret) == key_id


def test_new_secrets_parse_to_their_id_and_are_random() -> None:
    ids = {new_key_id() for _ in range(50)}
    assert len(ids) == 50
    for key_id in ids:
        secret = new_secret(key_id)
        assert parse_secret(secret) == key_id
    assert new_secret("0123456789abcdef") != new_secret("0123456789abcdef")


def test_only_the_digest_is_compared() -> None:
    secret = new_secret(new_key_id())
    stored = digest(secret)
    assert len(stored) == 64 and secret not in stored
    assert secret_matches(secret, stored)
    assert not secret_matches(secret + "x", stored)
    assert not secret_matches(secret, digest(secret + "x"))
    assert not secret_matches(secret, "")


NOW = 1_000.0


@pytest.mark.parametrize(
    ("expires_at", "revoked_at", "refusal"),
    [
        (None, None, None),
        (NOW + 1, None, None),
        (NOW, None, "expired"),  # expiry is the first instant it no longer works
        (NOW - 1, None, "expired"),
        (None, NOW, "revoked"),
        (None, NOW - 1, "revoked"),
        (None, NOW + 1, None),  # a revocation dated later (clock skew) is not yet in force
        (NOW - 1, NOW - 1, "revoked"),  # revoked wins: it is the operator's act
    ],
)
def test_key_refusal(
    expires_at: float | None, revoked_at: float | None, refusal: str | None
) -> None:
    assert key_refusal(expires_at, revoked_at, NOW) == refusal


@pytest.mark.parametrize(
    ("env", "notice"),
    [
        ({}, "auth is off: the API listens on loopback only; set REACH_SECURITY__REQUIRE_AUTH"),
        ({"REACH_SERVER__HOST": "localhost"}, "auth is off: the API listens on loopback only"),
        ({"REACH_SECURITY__REQUIRE_AUTH": "true"}, None),
        ({"REACH_SERVER__HOST": "0.0.0.0"}, None),
        (
            {"REACH_SERVER__HOST": "0.0.0.0", "REACH_SECURITY__REQUIRE_AUTH": "false"},
            "auth is off on 0.0.0.0",
        ),
    ],
)
def test_reach_up_says_when_the_hub_runs_open(env: dict[str, str], notice: str | None) -> None:
    from reach.cli.supervisor import _open_notice
    from reach.hub.settings import load_settings

    said = _open_notice(load_settings(environ={"REACH_HOME": "/nonexistent", **env}))
    if notice is None:
        assert said is None
    else:
        assert said is not None and said.startswith(notice), said


@pytest.mark.parametrize(
    ("principal", "caller", "allowed"),
    [
        (Principal(Scope.ADMIN, key_id="x"), "key:other", True),
        (OPEN, "key:c1", True),  # an open hub's anonymous principal is admin
        (CALLER, "key:c1", True),  # its own task
        (CALLER, "key:c2", False),
        (CALLER, None, False),
        (Principal(Scope.VIEWER, key_id="x"), "key:c1", False),  # reads all, ends none
        (Principal(Scope.APPROVER, key_id="x"), "key:c1", False),
        (agent_key("a-*"), "key:c1", False),  # routed to its agent: it reads, may not end
        (agent_key("a-*"), "agent:a-1", True),  # what one of its agents sent
        (agent_key("a-*"), "key:kagent", True),  # what the key itself sent
        (agent_key("planner"), "agent:other", False),
    ],
)
def test_who_may_cancel_a_task(principal: Principal, caller: str | None, allowed: bool) -> None:
    assert may_cancel_task(principal, caller) is allowed
