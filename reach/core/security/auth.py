"""Who is asking, and what they may do: API-key identities, scopes and the permission rules.

Pure: the hub authenticates a request (``reach.hub.security.apikeys``) into a `Principal`, and every
endpoint asks the functions here whether that principal may do what it asks. Secrets are
compared as SHA-256 digests with `hmac.compare_digest`, never with ``==``.

A key's secret is ``rk_<key_id>_<random>``: the id finds the stored row (a primary-key
read, no scan), the random part is checked against the stored digest. Only the digest is
stored; the secret is shown once, when the key is created.

Scopes::

    admin   everything: the /api/v1 admin API, dead-letter replay, trust changes
    caller  send, broadcast, start DAG runs; read the tasks it submitted
    agent   register / heartbeat / deregister / report for agent IDs matching its pattern;
            send as that agent (a reach from inside a handler); read what it sent or got
    viewer  read-only: the fleet, every task, dead letters, metrics, approvals
    approver  approve or reject parked tasks (issue 13), and read the approvals to decide
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase


class Scope(StrEnum):
    ADMIN = "admin"
    CALLER = "caller"
    AGENT = "agent"
    VIEWER = "viewer"
    APPROVER = "approver"


class Action(StrEnum):
    """What a request does, as far as permissions go."""

    ACT_AS_AGENT = "act_as_agent"  # register, heartbeat, deregister an agent's instance
    REPORT = "report"  # a result or progress report for a task delivered to an agent
    SUBMIT = "submit"  # send, broadcast, start a DAG run
    READ_TASK = "read_task"  # a task (and its events), subject to ownership
    READ_FLEET = "read_fleet"  # the admin read views: agents, instances, DLQ, metrics, audit
    ADMINISTER = "administer"  # replay, trust levels, allow-lists, keys
    APPROVE = "approve"  # approve or reject a task parked for a human decision
    READ_APPROVALS = "read_approvals"  # the approvals list and one approval


_ALLOWED: dict[Scope, frozenset[Action]] = {
    Scope.ADMIN: frozenset(Action),
    Scope.VIEWER: frozenset({Action.READ_TASK, Action.READ_FLEET, Action.READ_APPROVALS}),
    Scope.APPROVER: frozenset({Action.APPROVE, Action.READ_APPROVALS}),
    Scope.CALLER: frozenset({Action.SUBMIT, Action.READ_TASK}),
    Scope.AGENT: frozenset({Action.ACT_AS_AGENT, Action.REPORT, Action.SUBMIT, Action.READ_TASK}),
}

ANONYMOUS = "anonymous"
HUB = "hub"
KEY_PREFIX = "rk_"
_KEY_RE = re.compile(r"^rk_([a-z0-9]{12,32})_([A-Za-z0-9_-]{20,128})$")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: an API key (id, scope, agent pattern), or the anonymous
    principal of an open hub (``require_auth`` off), which may do everything."""

    scope: Scope
    key_id: str | None = None
    agent_pattern: str | None = None
    name: str = ""
    acting_agent: str | None = None  # an agent key acting as one agent it matches
    # what its agents may declare (fnmatch patterns; None: anything): ``reach keys allow``
    allowed_capabilities: tuple[str, ...] | None = None
    allowed_tags: tuple[str, ...] | None = None

    @property
    def anonymous(self) -> bool:
        return self.key_id is None

    @property
    def identity(self) -> str:
        """The identity recorded on what this principal does (tasks, events, audit) and the
        ``sub`` of the reach tokens minted for its tasks: ``agent:<id>`` for an agent acting
        as itself, ``key:<key_id>`` otherwise, ``anonymous`` on an open hub."""
        if self.acting_agent is not None:
            return f"agent:{self.acting_agent}"
        if self.key_id is None:
            return ANONYMOUS
        if self.scope is Scope.AGENT and self.agent_pattern and not _is_glob(self.agent_pattern):
            return f"agent:{self.agent_pattern}"
        return f"key:{self.key_id}"

    @property
    def agent_id(self) -> str | None:
        """The one agent this principal speaks for, if it is one."""
        identity = self.identity
        return identity[len("agent:") :] if identity.startswith("agent:") else None

    def acting_as(self, agent_id: str | None) -> Principal:
        """This principal acting as ``agent_id`` (an agent key sending from inside that
        agent's handler), when its pattern covers it; otherwise itself, unchanged."""
        if agent_id is None or self.scope is not Scope.AGENT or not self.matches_agent(agent_id):
            return self
        return Principal(
            self.scope, self.key_id, self.agent_pattern, self.name, agent_id,
            self.allowed_capabilities, self.allowed_tags,
        )  # fmt: skip

    def matches_agent(self, agent_id: str) -> bool:
        """Whether this principal may speak for ``agent_id`` (admins may for any)."""
        if self.scope is Scope.ADMIN:
            return True
        if self.scope is not Scope.AGENT or not self.agent_pattern:
            return False
        return fnmatchcase(agent_id, self.agent_pattern)


OPEN = Principal(Scope.ADMIN)
"""The principal of every request to a hub that runs without authentication."""


def permits(principal: Principal, action: Action) -> bool:
    """Whether the principal's scope includes ``action`` (ownership is checked apart)."""
    return action in _ALLOWED[principal.scope]


def may_act_for(principal: Principal, agent_id: str) -> bool:
    """Register, heartbeat, deregister or report for ``agent_id``."""
    return permits(principal, Action.ACT_AS_AGENT) and principal.matches_agent(agent_id)


def may_read_task(principal: Principal, caller: str | None, agent_id: str | None) -> bool:
    """Read a task submitted by ``caller`` and routed to ``agent_id`` (None: not yet).

    Admins and viewers read every task; a caller reads what it submitted; an agent reads
    what it submitted and what was delivered to an agent it speaks for. Whoever may not
    read a task is told it does not exist (not found and not yours look the same).
    """
    if principal.scope in (Scope.ADMIN, Scope.VIEWER):
        return True
    if caller is not None and _same_submitter(principal, caller):
        return True
    return (
        agent_id is not None
        and principal.scope is Scope.AGENT
        and principal.matches_agent(agent_id)
    )


def may_cancel_task(principal: Principal, caller: str | None) -> bool:
    """Cancel a task submitted by ``caller`` (and so withdraw its approval request): its
    submitter, or an admin. Reading is not enough: an agent reads the tasks routed to it,
    and a viewer every task, and neither may end a caller's task."""
    if principal.scope is Scope.ADMIN:
        return True
    return caller is not None and _same_submitter(principal, caller)


def _same_submitter(principal: Principal, caller: str) -> bool:
    if caller == principal.identity or (
        principal.key_id is not None and caller == f"key:{principal.key_id}"
    ):
        return True
    # an agent key with a glob pattern: anything one of its agents submitted
    return (
        principal.scope is Scope.AGENT
        and caller.startswith("agent:")
        and principal.matches_agent(caller[len("agent:") :])
    )


def undeclarable(
    principal: Principal, tags: Iterable[str], capabilities: Iterable[str]
) -> list[str]:
    """What a registration by ``principal`` declares beyond its key's allow-lists
    (``tag:x`` / ``capability:y``), empty when it may declare all of it. A key without a
    list (and an admin, and an open hub) may declare anything of that kind."""
    if principal.scope is Scope.ADMIN:
        return []
    beyond: list[str] = []
    for kind, names, allowed in (
        ("capability", capabilities, principal.allowed_capabilities),
        ("tag", tags, principal.allowed_tags),
    ):
        if allowed is None:
            continue
        beyond += [f"{kind}:{n}" for n in names if not any(fnmatchcase(n, p) for p in allowed)]
    return beyond


def auth_required(setting: bool | None, bind_host: str) -> bool:
    """``security.require_auth`` resolved: unset means required unless the API listens on
    loopback only (the demo may run open; anything reachable from elsewhere may not)."""
    if setting is not None:
        return setting
    return not is_loopback_host(bind_host)


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address; ``0.0.0.0`` and ``::`` listen everywhere."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# -- key secrets -------------------------------------------------------------------------


def new_key_id() -> str:
    return secrets.token_hex(8)


def new_secret(key_id: str) -> str:
    """A fresh secret for ``key_id``: ``rk_<key_id>_<43 random URL-safe characters>``."""
    return f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def parse_secret(secret: str) -> str | None:
    """The key id a presented secret names, or None when it is not shaped like one."""
    match = _KEY_RE.fullmatch(secret)  # not match(): its ``$`` lets a trailing newline by
    return match.group(1) if match else None


def digest(secret: str) -> str:
    """What is stored of a secret: its SHA-256, hex (secrets are random, so no salt is
    needed to stop a dictionary; a slow hash would only slow every request)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_digest: str) -> bool:
    """Timing-safe: the comparison takes as long whichever byte differs."""
    return hmac.compare_digest(digest(secret).encode(), stored_digest.encode())


def key_refusal(expires_at: float | None, revoked_at: float | None, now: float) -> str | None:
    """Why a stored key no longer authenticates (``revoked``, ``expired``), or None."""
    if revoked_at is not None and revoked_at <= now:
        return "revoked"
    if expires_at is not None and expires_at <= now:
        return "expired"
    return None


def bearer_of(header: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <credential>`` header, or None."""
    if not header:
        return None
    kind, _, value = header.strip().partition(" ")
    if kind.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")
