"""Trust levels: how much the hub trusts an agent, set by an admin, never self-declared.

L1  core agents: mutual TLS between hub and agent, plus the reach token
L2  the reach token (over TLS in production): the default
L3  external plugins: an allow-list of what it may call and who may call it, a lower
    payload cap, and every reach to or from it in the audit trail
"""

from __future__ import annotations

from enum import StrEnum


class TrustLevel(StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"


DEFAULT_TRUST = TrustLevel.L2
