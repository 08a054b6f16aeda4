"""Trust levels: how much the hub trusts an agent, set by an admin, never self-declared.

L1  core agents: mutual TLS between hub and agent, plus the reach token
L2  the reach token (over TLS in production): the default
L3  external plugins: an allow-list of what it may call and who may call it, a lower
    payload cap, and every reach to or from it in the audit trail
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any


class TrustLevel(StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"


DEFAULT_TRUST = TrustLevel.L2


# -- mutual TLS (L1): who is on the other end of a connection ---------------------------

HUB_URI = "urn:agent-reach:hub"
"""The SAN URI of the hub's client certificate: an L1 agent serves only this peer."""

IDENTITY_DOMAIN = "agent.reach"


def agent_uri(agent_id: str) -> str:
    """The SAN URI naming the agent an agent certificate was issued to."""
    return f"urn:agent-reach:agent:{agent_id}"


def identity_name(agent_id: str) -> str:
    """The DNS name in an L1 agent's certificate that says *which* agent it is.

    Agent IDs may hold characters a DNS label may not, and verifiers check DNS names
    before any body is sent (``assert_hostname``), so the name is a digest of the ID:
    ``<first 32 hex digits of sha256(agent_id)>.agent.reach`` (a 32-character label,
    within the 63 allowed). The hub asserts it for the agent it means to reach, so a
    certificate issued to another agent fails the handshake.
    """
    return f"{hashlib.sha256(agent_id.encode()).hexdigest()[:32]}.{IDENTITY_DOMAIN}"


def mtls_refusal(endpoint_url: str) -> str | None:
    """Why the hub must not contact an L1 agent at this endpoint, or None if it may.

    An L1 agent is reached over https with both certificates checked; any other scheme
    would send the payload in the clear, so the attempt fails before a connection opens.
    """
    scheme = endpoint_url.split("://", 1)[0].lower() if "://" in endpoint_url else ""
    if scheme != "https":
        return (
            f"L1 agent requires https + mTLS: its endpoint {endpoint_url} is not https "
            "(re-register it with an https:// address served with its reach certs)"
        )
    return None


# -- L3 (external plugins): the allow-list and the payload cap --------------------------


@dataclass(frozen=True, slots=True)
class AllowList:
    """An agent's allow-list, as an admin set it (``reach agents allow``).

    ``call``: fnmatch patterns of the capabilities (methods) an L3 agent may reach;
    ``callable_by``: agent IDs or identities (``agent:<id>``, ``key:<key_id>``,
    ``anonymous``; fnmatch patterns too) that may reach it. Empty lists allow nothing.
    """

    call: tuple[str, ...] = ()
    callable_by: tuple[str, ...] = ()


NO_RULES = AllowList()


def is_l3(trust: str | None) -> bool:
    return trust == TrustLevel.L3


def l3_refusal(
    *,
    caller_agent: str | None,
    caller_trust: str | None,
    caller_rules: AllowList,
    target_agent: str,
    target_trust: str | None,
    target_rules: AllowList,
    invoked: Sequence[str],
    caller_identity: str,
) -> str | None:
    """Why this reach must not happen, or None when the L3 rules allow it.

    ``invoked`` is what the reach calls: its method and, when the route names one, its
    capability. A reach FROM an L3 agent must match one of that agent's ``call``
    patterns with every one of them: the method is the capability the target runs, so
    matching the named capability alone would let ``capability=search`` smuggle in
    ``method=refund``. A reach TO an L3 agent needs the caller's agent ID or identity in
    the target's ``callable_by``.

    Admins are not exempt from the target rule: what an L3 plugin receives leaves the
    trusted core whoever sends it, and an admin key is the credential most worth
    stealing. An admin who means to reach a plugin adds themselves (``key:<key_id>``)
    to its ``callable_by``, which is explicit and audited. The caller's own rule binds
    only agents: a key that acts as no agent is not a plugin.
    """
    if caller_agent is not None and is_l3(caller_trust):
        names = [name for name in invoked if name] or [""]
        for name in names:
            if not any(fnmatchcase(name, pattern) for pattern in caller_rules.call):
                return (
                    f"L3 agent {caller_agent!r} may not call {name!r}: "
                    "it is not in the agent's allow-list (reach agents allow --call)"
                )
    if is_l3(target_trust) and not _callable_by(
        target_rules.callable_by, caller_agent, caller_identity
    ):
        who = repr(caller_identity) if caller_agent is None else f"agent {caller_agent!r}"
        return (
            f"L3 agent {target_agent!r} may be reached only by the callers in its "
            f"allow-list, and {who} is not one (reach agents allow --callable-by)"
        )
    return None


def _callable_by(patterns: Sequence[str], agent: str | None, identity: str) -> bool:
    for pattern in patterns:
        if fnmatchcase(identity, pattern):
            return True
        if agent is not None and fnmatchcase(agent, pattern):
            return True
    return False


def payload_cap(caller_trust: str | None, target_trust: str | None, l3_cap: int) -> int | None:
    """The payload cap of a reach (bytes of its JSON): ``l3_cap`` when either end is L3."""
    return l3_cap if is_l3(caller_trust) or is_l3(target_trust) else None


def payload_size(payload: Any) -> int:
    """A payload's size as the cap counts it: its compact UTF-8 JSON."""
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
