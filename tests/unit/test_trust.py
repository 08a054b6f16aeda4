"""The L3 rules as a table: who may reach an external plugin, what it may reach, how much."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.security.trust import (
    NO_RULES,
    AllowList,
    TrustLevel,
    is_l3,
    l3_refusal,
    payload_cap,
    payload_size,
)

L1, L2, L3 = TrustLevel.L1, TrustLevel.L2, TrustLevel.L3
SEARCH_ONLY = AllowList(call=("search.*",))
PLANNER_MAY = AllowList(callable_by=("planner",))


def _refusal(**overrides: Any) -> str | None:
    args: dict[str, Any] = {
        "caller_agent": None,
        "caller_trust": None,
        "caller_rules": NO_RULES,
        "target_agent": "target",
        "target_trust": L2,
        "target_rules": NO_RULES,
        "invoked": ("echo",),
        "caller_identity": "key:k1",
    }
    args.update(overrides)
    return l3_refusal(**args)


@pytest.mark.parametrize(
    ("overrides", "refused_with"),
    [
        # nothing L3 at either end: nothing to say
        ({}, None),
        ({"caller_agent": "a", "caller_trust": L2, "caller_identity": "agent:a"}, None),
        ({"caller_agent": "a", "caller_trust": L1, "target_trust": L1}, None),
        # FROM an L3 agent: the invoked capability must match one of its call patterns
        (
            {"caller_agent": "plug", "caller_trust": L3, "caller_rules": SEARCH_ONLY},
            "may not call 'echo'",
        ),
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": SEARCH_ONLY,
                "invoked": ("search.web",),
            },
            None,
        ),
        (
            {"caller_agent": "plug", "caller_trust": L3, "caller_rules": NO_RULES},
            "may not call 'echo'",
        ),
        # every invoked name must match: a named capability cannot cover another method
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": SEARCH_ONLY,
                "invoked": ("refund", "search.web"),
            },
            "may not call 'refund'",
        ),
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": AllowList(call=("search.*", "echo")),
                "invoked": ("echo", "search.web"),
            },
            None,
        ),
        # fnmatch is case-sensitive: Search.web is not search.*
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": SEARCH_ONLY,
                "invoked": ("Search.web",),
            },
            "may not call 'Search.web'",
        ),
        # the caller rule binds agents only: a key acting as no agent is not a plugin
        ({"caller_agent": None, "caller_trust": L3, "caller_rules": NO_RULES}, None),
        # TO an L3 agent: the caller's agent ID or identity must be in callable_by
        ({"target_trust": L3}, "may be reached only by the callers in its allow-list"),
        (
            {"target_trust": L3, "target_rules": PLANNER_MAY, "caller_agent": "planner"},
            None,
        ),
        (
            {
                "target_trust": L3,
                "target_rules": AllowList(callable_by=("agent:planner",)),
                "caller_agent": "planner",
                "caller_identity": "agent:planner",
            },
            None,
        ),
        (
            {"target_trust": L3, "target_rules": AllowList(callable_by=("key:k1",))},
            None,
        ),
        (
            {"target_trust": L3, "target_rules": AllowList(callable_by=("key:k2",))},
            "'key:k1' is not one",
        ),
        (
            {"target_trust": L3, "target_rules": AllowList(callable_by=("plan-*",))},
            "not one",
        ),
        (
            {
                "target_trust": L3,
                "target_rules": AllowList(callable_by=("plan-*",)),
                "caller_agent": "plan-7",
                "caller_identity": "agent:plan-7",
            },
            None,
        ),
        # a bare value names an agent, never a key: key id "planner" is not agent planner
        (
            {"target_trust": L3, "target_rules": PLANNER_MAY, "caller_identity": "key:planner"},
            "not one",
        ),
        # an open hub's anonymous caller needs ``anonymous`` listed like anyone else
        (
            {"target_trust": L3, "target_rules": PLANNER_MAY, "caller_identity": "anonymous"},
            "'anonymous' is not one",
        ),
        (
            {
                "target_trust": L3,
                "target_rules": AllowList(callable_by=("anonymous",)),
                "caller_identity": "anonymous",
            },
            None,
        ),
        # the target's call list says nothing of who may call it
        (
            {"target_trust": L3, "target_rules": AllowList(call=("*",))},
            "may be reached only by",
        ),
        # L3 to L3: both rules apply
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": AllowList(call=("echo",)),
                "target_trust": L3,
                "target_rules": AllowList(callable_by=("plug",)),
            },
            None,
        ),
        (
            {
                "caller_agent": "plug",
                "caller_trust": L3,
                "caller_rules": AllowList(call=("echo",)),
                "target_trust": L3,
                "target_rules": NO_RULES,
            },
            "agent 'plug' is not one",
        ),
        # an L3 agent reaching itself is a reach like any other
        (
            {
                "caller_agent": "target",
                "caller_trust": L3,
                "caller_rules": AllowList(call=("echo",)),
                "target_trust": L3,
            },
            "not one",
        ),
    ],
)
def test_l3_refusal(overrides: dict[str, Any], refused_with: str | None) -> None:
    reason = _refusal(**overrides)
    if refused_with is None:
        assert reason is None
    else:
        assert reason is not None and refused_with in reason


@pytest.mark.parametrize("level", ["L3", TrustLevel.L3])
def test_admin_key_is_not_exempt_from_the_target_rule(level: str) -> None:
    """An admin key is a ``key:<id>`` identity like any other to an L3 plugin."""
    assert _refusal(target_trust=level, caller_identity="key:admin1") is not None
    rules = AllowList(callable_by=("key:admin1",))
    assert _refusal(target_trust=level, target_rules=rules, caller_identity="key:admin1") is None


@pytest.mark.parametrize(
    ("caller", "target", "cap"),
    [
        (None, None, None),
        (L2, L2, None),
        (L1, L2, None),
        (L3, L2, 1000),
        (L2, L3, 1000),
        (L3, L3, 1000),
        (None, "L3", 1000),
    ],
)
def test_payload_cap(caller: str | None, target: str | None, cap: int | None) -> None:
    assert payload_cap(caller, target, 1000) == cap


@pytest.mark.parametrize(
    ("payload", "size"),
    [({}, 2), ({"a": 1}, 7), ({"text": "é"}, 13), ([1, 2], 5)],
)
def test_payload_size_is_compact_utf8_json(payload: Any, size: int) -> None:
    assert payload_size(payload) == size


@pytest.mark.parametrize(
    ("trust", "l3"), [("L3", True), (TrustLevel.L3, True), ("L2", False), (None, False)]
)
def test_is_l3(trust: str | None, l3: bool) -> None:
    assert is_l3(trust) is l3
