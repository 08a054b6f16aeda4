"""The approval gate's rules: which tasks wait for a human, and who may decide them.

Pure: the hub (``reach.hub.gates.approvals``) parks, decides and expires; these functions say
whether a capability needs a decision, what the decision is bound to (the payload's
hash) and why a decision is refused. A refusal is a short reason string the service turns
into its typed error, so the rules can be table-tested without a store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Final

from reach.core.ledger.statuses import ApprovalStatus

__all__ = [
    "DECIDED",
    "EXPIRED",
    "NO_REASON",
    "SELF_APPROVAL",
    "ApprovalStatus",
    "decision_refusal",
    "designated",
    "needs_approval",
    "payload_hash",
]

DECIDED: Final = "decided"
EXPIRED: Final = "expired"
SELF_APPROVAL: Final = "self_approval"
NO_REASON: Final = "no_reason"


def needs_approval(
    capability_decl: Mapping[str, Any] | None,
    method: str,
    capability: str | None,
    policy_patterns: Iterable[str],
) -> bool:
    """Whether a task invoking ``method`` (routed by ``capability``, if any) must wait for
    a human: its declaration says ``require_approval`` or ``danger_level: high``, or the
    hub's policy (``approval.capabilities``, fnmatch patterns) names the method or the
    capability. The policy holds even for an agent that declares nothing."""
    if capability_decl is not None and (
        capability_decl.get("require_approval") is True
        or capability_decl.get("danger_level") == "high"
    ):
        return True
    names = [n for n in (method, capability) if n]
    return any(fnmatchcase(name, pattern) for pattern in policy_patterns for name in names)


def payload_hash(payload: Any) -> str:
    """SHA-256 (hex) of the payload's canonical JSON: what an approval is bound to, so
    the same payload hashes the same whichever side (or store) serialised it."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def designated(
    approvers: Iterable[tuple[str, Iterable[str]]], capability: str
) -> frozenset[str] | None:
    """The key names (holders) designated to decide approvals of ``capability``: those of
    every ``approval.approvers`` pattern it matches, or None when none matches (any key
    with the approve scope may decide)."""
    found: set[str] = set()
    matched = False
    for pattern, holders in approvers:
        if fnmatchcase(capability, pattern):
            matched = True
            found.update(holders)
    return frozenset(found) if matched else None


def decision_refusal(
    status: ApprovalStatus | str,
    expires_at: float,
    now: float,
    decider_identity: str,
    requester_identity: str | None,
    forbid_self: bool,
    reason: str | None,
    verb: str,
    decider_holder: str | None = None,
    requester_holder: str | None = None,
) -> str | None:
    """Why ``decider_identity`` may not ``verb`` (``approve`` / ``reject``) this approval
    now, or None: already decided (`DECIDED`), past ``expires_at`` (`EXPIRED`, even when
    the sweep has not marked it yet), the requester deciding its own request while
    ``forbid_self`` (`SELF_APPROVAL`; the anonymous identity of an open hub is nobody's
    own) -- by the same key, or by another key of the same holder (the keys' names:
    ``decider_holder``, ``requester_holder``) -- or a rejection without a reason
    (`NO_REASON`)."""
    current = ApprovalStatus(status)
    if current is ApprovalStatus.EXPIRED:
        return EXPIRED
    if current is not ApprovalStatus.PENDING:
        return DECIDED
    if now >= expires_at:
        return EXPIRED
    if (
        forbid_self
        and requester_identity is not None
        and requester_identity != "anonymous"
        and decider_identity == requester_identity
    ):
        return SELF_APPROVAL
    if forbid_self and decider_holder and decider_holder == requester_holder:
        return SELF_APPROVAL  # the same person's second key
    if verb == "reject" and not (reason or "").strip():
        return NO_REASON
    return None
