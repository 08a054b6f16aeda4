"""The approval gate's pure rules: which tasks wait, what they are bound to, who may decide."""

from __future__ import annotations

import hashlib

import pytest

from reach.core.gates.approvals import (
    DECIDED,
    EXPIRED,
    NO_REASON,
    SELF_APPROVAL,
    decision_refusal,
    designated,
    needs_approval,
    payload_hash,
)
from reach.core.ledger.statuses import ApprovalStatus

REQUIRE = {"type": "cancel_order", "require_approval": True}
HIGH = {"type": "cancel_order", "danger_level": "high"}
MEDIUM = {"type": "cancel_order", "danger_level": "medium", "require_approval": False}
PLAIN = {"type": "cancel_order"}


@pytest.mark.parametrize(
    ("decl", "method", "capability", "patterns", "expected"),
    [
        (REQUIRE, "cancel_order", None, [], True),
        (HIGH, "cancel_order", None, [], True),
        (MEDIUM, "cancel_order", None, [], False),
        (PLAIN, "cancel_order", None, [], False),
        (None, "cancel_order", None, [], False),
        (None, "payments.refund", None, ["payments.*"], True),  # policy, no declaration
        (PLAIN, "refund", "payments.refund", ["payments.*"], True),  # the routed capability
        (PLAIN, "refund", None, ["payments.*"], False),
        (PLAIN, "payments", None, ["payments.*"], False),  # fnmatch, not a prefix
        (PLAIN, "Payments.x", None, ["payments.*"], False),  # case-sensitive
        (PLAIN, "a", None, ["b", "a"], True),
        ({"require_approval": "yes"}, "x", None, [], False),  # only a real true counts
    ],
)
def test_needs_approval(
    decl: dict[str, object] | None,
    method: str,
    capability: str | None,
    patterns: list[str],
    expected: bool,
) -> None:
    assert needs_approval(decl, method, capability, patterns) is expected


def test_payload_hash_is_sha256_of_canonical_json() -> None:
    expected = hashlib.sha256('{"a":1,"b":"é"}'.encode()).hexdigest()
    assert payload_hash({"b": "é", "a": 1}) == expected
    assert payload_hash({"a": 1, "b": "é"}) == expected  # key order does not matter
    assert payload_hash({"a": 1, "b": "e"}) != expected
    assert payload_hash(None) == hashlib.sha256(b"null").hexdigest()
    assert len(payload_hash([1, 2])) == 64


P = ApprovalStatus.PENDING
NOW = 1000.0


@pytest.mark.parametrize(
    ("status", "expires_at", "decider", "requester", "forbid", "reason", "verb", "expected"),
    [
        (P, NOW + 1, "key:b", "key:a", True, None, "approve", None),
        (P, NOW + 1, "key:b", "key:a", True, "too risky", "reject", None),
        (P, NOW + 1, "key:b", "key:a", True, None, "reject", NO_REASON),
        (P, NOW + 1, "key:b", "key:a", True, "   ", "reject", NO_REASON),
        (P, NOW + 1, "key:a", "key:a", True, None, "approve", SELF_APPROVAL),
        (P, NOW + 1, "key:a", "key:a", True, "no", "reject", SELF_APPROVAL),
        (P, NOW + 1, "key:a", "key:a", False, None, "approve", None),
        (P, NOW + 1, "anonymous", "anonymous", True, None, "approve", None),  # open hub
        (P, NOW + 1, "key:a", None, True, None, "approve", None),
        (P, NOW, "key:b", "key:a", True, None, "approve", EXPIRED),  # due, not yet swept
        (P, NOW - 5, "key:a", "key:a", True, None, "approve", EXPIRED),
        (ApprovalStatus.EXPIRED, NOW + 1, "key:b", "key:a", True, None, "approve", EXPIRED),
        (ApprovalStatus.APPROVED, NOW + 1, "key:b", "key:a", True, None, "approve", DECIDED),
        (ApprovalStatus.REJECTED, NOW + 1, "key:b", "key:a", True, "x", "reject", DECIDED),
        (ApprovalStatus.CANCELLED, NOW + 1, "key:b", "key:a", True, None, "approve", DECIDED),
        ("approved", NOW - 5, "key:b", "key:a", True, None, "approve", DECIDED),  # a stored str
    ],
)
def test_decision_refusal(
    status: ApprovalStatus | str,
    expires_at: float,
    decider: str,
    requester: str | None,
    forbid: bool,
    reason: str | None,
    verb: str,
    expected: str | None,
) -> None:
    got = decision_refusal(status, expires_at, NOW, decider, requester, forbid, reason, verb)
    assert got == expected


@pytest.mark.parametrize(
    ("decider_holder", "requester_holder", "forbid", "expected"),
    [
        ("alice", "alice", True, SELF_APPROVAL),  # the same person's second key
        ("alice", "alice", False, None),
        ("carol", "alice", True, None),
        (None, None, True, None),  # unnamed keys: nobody's holder
        ("", "", True, None),
    ],
)
def test_a_holder_does_not_decide_their_own_request(
    decider_holder: str | None, requester_holder: str | None, forbid: bool, expected: str | None
) -> None:
    got = decision_refusal(
        ApprovalStatus.PENDING, NOW + 60, NOW, "key:b", "key:a", forbid, None, "approve",
        decider_holder=decider_holder, requester_holder=requester_holder,
    )  # fmt: skip
    assert got == expected


@pytest.mark.parametrize(
    ("approvers", "capability", "expected"),
    [
        ((), "policy.pay", None),  # nobody designated: any approver key decides
        ((("policy.*", ("alice",)),), "policy.pay", frozenset({"alice"})),
        ((("policy.*", ("alice",)),), "orders.cancel", None),
        (
            (("policy.*", ("alice",)), ("*.pay", ("carol",))),
            "policy.pay",
            frozenset({"alice", "carol"}),
        ),
        ((("policy.*", ()),), "policy.pay", frozenset()),  # designated: nobody may decide
    ],
)
def test_designated_approvers(
    approvers: tuple[tuple[str, tuple[str, ...]], ...],
    capability: str,
    expected: frozenset[str] | None,
) -> None:
    assert designated(approvers, capability) == expected
