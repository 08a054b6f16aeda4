"""Trust levels and allow-lists in the store, and the L3 screen every reach passes.

An agent's trust level (``agents.trust_level``) and its allow-list (``agent_allow_rules``)
are set by an admin only, never by the agent's registration; every change goes to the
audit log with the admin's identity and the old and new values, in the same transaction.

The screen (`judge`, and `screen_candidates` for a route's instances) applies
`reach.core.security.trust.l3_refusal` and the L3 payload cap to a reach, given who sends it (the
task's ``caller`` identity) and which agent it targets; `record_reach` writes the audit
row of every reach to or from an L3 agent. Submission and delivery ask it only when an
L3 agent may be involved, so a fleet without one pays at most the caller's trust level
(one primary-key read, and only when the caller is an agent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from reach.core.fleet.routing import Candidate
from reach.core.security.auth import ANONYMOUS
from reach.core.security.trust import (
    DEFAULT_TRUST,
    NO_RULES,
    AllowList,
    TrustLevel,
    is_l3,
    l3_refusal,
    payload_cap,
    payload_size,
)
from reach.errors import (
    Forbidden,
    InvalidRegistration,
    ReachError,
    RequestTooLarge,
    UnknownAgent,
)
from reach.hub.security import audit
from reach.hub.settings import SecuritySettings
from reach.hub.storage.models import AgentAllowRuleRow, AgentRow

MAX_RULE_VALUE = 160  # agent_allow_rules.value
DEFAULT_L3_CAP: int = SecuritySettings.model_fields["l3_max_payload_bytes"].default


class RuleKind(StrEnum):
    CALL = "call"  # a capability (method) pattern an L3 agent may reach
    CALLABLE_BY = "callable_by"  # an agent ID or identity that may reach an L3 agent


# -- admin changes -----------------------------------------------------------------------


def set_trust(
    session: Session, agent_id: str, level: TrustLevel, *, actor: str, now: float
) -> dict[str, Any]:
    """Set the agent's trust level (audited with the old and the new level)."""
    agent = _agent(session, agent_id, lock=True)
    previous = agent.trust_level or DEFAULT_TRUST.value
    agent.trust_level = TrustLevel(level).value
    agent.updated_at = now
    audit.record(
        session,
        actor=actor,
        action="agent.trust",
        outcome=audit.ALLOWED,
        now=now,
        target=f"agent:{agent_id}",
        detail={"old": previous, "new": agent.trust_level},
    )
    session.flush()
    return {"agent_id": agent_id, "trust_level": agent.trust_level, "previous": previous}


def add_rule(
    session: Session, agent_id: str, kind: RuleKind, value: str, *, actor: str, now: float
) -> dict[str, Any]:
    """Add one entry to the agent's allow-list (adding one it has changes nothing)."""
    _agent(session, agent_id, lock=True)
    value = _checked_value(value)
    before = rules_of(session, agent_id)
    exists = session.scalar(_rule(agent_id, kind, value)) is not None
    if not exists:
        session.add(
            AgentAllowRuleRow(
                agent_id=agent_id, kind=kind.value, value=value, created_at=now, created_by=actor
            )
        )
        session.flush()
        _audit_rule(session, "agent.allow", agent_id, kind, value, before, actor, now)
    return {**allow_list_view(session, agent_id), "changed": not exists}


def remove_rule(
    session: Session, agent_id: str, kind: RuleKind, value: str, *, actor: str, now: float
) -> dict[str, Any]:
    """Remove one entry from the agent's allow-list (removing one it lacks changes nothing)."""
    _agent(session, agent_id, lock=True)
    before = rules_of(session, agent_id)
    removed = session.execute(
        delete(AgentAllowRuleRow).where(
            AgentAllowRuleRow.agent_id == agent_id,
            AgentAllowRuleRow.kind == kind.value,
            AgentAllowRuleRow.value == value,
        )
    )
    changed = bool(getattr(removed, "rowcount", 0))
    if changed:
        _audit_rule(session, "agent.disallow", agent_id, kind, value, before, actor, now)
    return {**allow_list_view(session, agent_id), "changed": changed}


def _audit_rule(
    session: Session,
    action: str,
    agent_id: str,
    kind: RuleKind,
    value: str,
    before: AllowList,
    actor: str,
    now: float,
) -> None:
    """One audit row for an allow-list change: the entry, and the list before and after."""
    audit.record(
        session,
        actor=actor,
        action=action,
        outcome=audit.ALLOWED,
        now=now,
        target=f"agent:{agent_id}",
        detail={
            "kind": kind.value,
            "value": value,
            "old": _listed(before, kind),
            "new": _listed(rules_of(session, agent_id), kind),
        },
    )


def rules_of(session: Session, agent_id: str) -> AllowList:
    """The agent's allow-list (empty for an agent without one)."""
    rows = session.execute(
        select(AgentAllowRuleRow.kind, AgentAllowRuleRow.value)
        .where(AgentAllowRuleRow.agent_id == agent_id)
        .order_by(AgentAllowRuleRow.kind, AgentAllowRuleRow.value)
    ).all()
    return AllowList(
        call=tuple(v for k, v in rows if k == RuleKind.CALL),
        callable_by=tuple(v for k, v in rows if k == RuleKind.CALLABLE_BY),
    )


def allow_list_view(session: Session, agent_id: str) -> dict[str, Any]:
    """The agent's trust level and allow-list, with who added each entry and when."""
    agent = _agent(session, agent_id)
    rows = session.scalars(
        select(AgentAllowRuleRow)
        .where(AgentAllowRuleRow.agent_id == agent_id)
        .order_by(AgentAllowRuleRow.kind, AgentAllowRuleRow.value)
    ).all()
    return {
        "agent_id": agent_id,
        "trust_level": agent.trust_level or DEFAULT_TRUST.value,
        "call": [r.value for r in rows if r.kind == RuleKind.CALL],
        "callable_by": [r.value for r in rows if r.kind == RuleKind.CALLABLE_BY],
        "rules": [
            {
                "kind": r.kind,
                "value": r.value,
                "created_at": r.created_at,
                "created_by": r.created_by,
            }
            for r in rows
        ],
    }


# -- the screen of a reach ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Party:
    """One end of a reach as the L3 rules see it."""

    agent_id: str | None
    trust: str | None
    rules: AllowList = NO_RULES


def agent_of(identity: str | None) -> str | None:
    """The agent an identity speaks for (``agent:<id>``), if any."""
    if identity and identity.startswith("agent:"):
        return identity[len("agent:") :]
    return None


def caller_party(session: Session, identity: str | None) -> Party:
    """The caller of a reach: its agent (if it is one), that agent's trust and rules."""
    agent_id = agent_of(identity)
    if agent_id is None:
        return Party(None, None)
    trust = session.scalar(select(AgentRow.trust_level).where(AgentRow.agent_id == agent_id))
    return party(session, agent_id, trust)


def party(session: Session, agent_id: str, trust: str | None) -> Party:
    """An agent of known trust; its rules are read only when it is L3."""
    return Party(agent_id, trust, rules_of(session, agent_id) if is_l3(trust) else NO_RULES)


def judge(
    caller: Party,
    identity: str | None,
    target: Party,
    invoked: Sequence[str],
    payload: Any,
    l3_cap: int,
) -> ReachError | None:
    """The refusal of this reach (403 ``forbidden``, 413 ``payload-too-large``), or None."""
    reason = l3_refusal(
        caller_agent=caller.agent_id,
        caller_trust=caller.trust,
        caller_rules=caller.rules,
        target_agent=target.agent_id or "",
        target_trust=target.trust,
        target_rules=target.rules,
        invoked=invoked,
        caller_identity=identity or ANONYMOUS,
    )
    if reason is not None:
        return Forbidden(reason, agent_id=target.agent_id)
    cap = payload_cap(caller.trust, target.trust, l3_cap)
    if cap is not None:
        size = payload_size(payload)
        if size > cap:
            return RequestTooLarge(
                f"the payload is {size} bytes; reaches to or from an L3 agent carry at most "
                f"{cap} (security.l3_max_payload_bytes)",
                size=size,
                limit=cap,
            )
    return None


def involves_l3(caller: Party, target: Party) -> bool:
    return is_l3(caller.trust) or is_l3(target.trust)


def record_reach(
    session: Session,
    *,
    identity: str | None,
    caller: Party,
    target: Party,
    invoked: Sequence[str],
    now: float,
    task_id: str | None,
    refusal: ReachError | None = None,
    stage: str = "submit",
    extra: dict[str, Any] | None = None,
) -> None:
    """An audit row for a reach to or from an L3 agent, allowed or refused."""
    audit.record(
        session,
        actor=identity or ANONYMOUS,
        action="reach",
        outcome=audit.ALLOWED if refusal is None else audit.REFUSED,
        now=now,
        target=f"agent:{target.agent_id}" if target.agent_id else "",
        task_id=task_id,
        detail={
            "stage": stage,
            "invoked": list(invoked),
            "caller_agent": caller.agent_id,
            "caller_trust": caller.trust,
            "target_trust": target.trust,
            **({"reason": refusal.detail, "refusal": refusal.slug} if refusal else {}),
            **(extra or {}),
        },
    )


def invoked_by(method: str, capability: str | None) -> tuple[str, ...]:
    """What a reach calls, as `reach.core.security.trust.l3_refusal` matches it."""
    return (method,) if not capability or capability == method else (method, capability)


@dataclass(frozen=True, slots=True)
class Screened:
    """Routing candidates after the L3 screen of one delivery."""

    identity: str | None
    caller: Party
    invoked: tuple[str, ...]
    allowed: list[Candidate]
    refused: dict[str, ReachError]  # agent ID -> why the caller may not reach it

    @property
    def reason(self) -> str:
        return "; ".join(f"{a}: {e.detail}" for a, e in sorted(self.refused.items()))

    def record(
        self, session: Session, chosen: Candidate, task_id: str, attempt_seq: int, now: float
    ) -> None:
        """The audit row of a delivery to (or from) an L3 agent."""
        record_reach(
            session,
            identity=self.identity,
            caller=self.caller,
            target=Party(chosen.agent_id, chosen.trust_level),
            invoked=self.invoked,
            now=now,
            task_id=task_id,
            stage="dispatch",
            extra={"instance_id": chosen.instance_id, "attempt_seq": attempt_seq},
        )


def screen_candidates(
    session: Session,
    identity: str | None,
    candidates: Sequence[Candidate],
    method: str,
    capability: str | None,
    payload: Any,
    l3_cap: int,
) -> Screened:
    """Drop the L3 instances this caller may not reach (its ``callable_by``, the payload
    cap) from a route's candidates; the others stay as they are, in their order.

    Submission refused the reach if no agent of the route was allowed; this runs again
    at each delivery because an admin may have changed a level or a list since."""
    caller = caller_party(session, identity)
    invoked = invoked_by(method, capability)
    verdicts: dict[str, ReachError | None] = {}
    allowed = []
    for c in candidates:
        if c.agent_id not in verdicts:
            if is_l3(c.trust_level) or is_l3(caller.trust):
                target = party(session, c.agent_id, c.trust_level)
                verdicts[c.agent_id] = judge(caller, identity, target, invoked, payload, l3_cap)
            else:
                verdicts[c.agent_id] = None
        if verdicts[c.agent_id] is None:
            allowed.append(c)
    refused = {a: e for a, e in verdicts.items() if e is not None}
    return Screened(identity, caller, invoked, allowed, refused)


# -- helpers -------------------------------------------------------------------------------


def _agent(session: Session, agent_id: str, *, lock: bool = False) -> AgentRow:
    agent = session.get(AgentRow, agent_id, with_for_update=lock)
    if agent is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered", agent_id=agent_id)
    return agent


def _rule(agent_id: str, kind: RuleKind, value: str) -> Any:
    return select(AgentAllowRuleRow.id).where(
        AgentAllowRuleRow.agent_id == agent_id,
        AgentAllowRuleRow.kind == kind.value,
        AgentAllowRuleRow.value == value,
    )


def _checked_value(value: str) -> str:
    value = value.strip()
    if not value or len(value) > MAX_RULE_VALUE or any(ch.isspace() for ch in value):
        raise InvalidRegistration(
            f"an allow-list entry is one pattern of 1 to {MAX_RULE_VALUE} characters "
            "without whitespace",
            field="value",
        )
    return value


def _listed(rules: AllowList, kind: RuleKind) -> list[str]:
    return list(rules.call if kind is RuleKind.CALL else rules.callable_by)
