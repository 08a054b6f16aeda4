"""Route selection: which instance of which agent gets a task, as a pure function.

The caller (the delivery task) loads the registry and the reachability verdicts into
`Candidate` objects and passes them in together with a `RouteFilter` and a `random.Random`;
nothing here reads a clock, the network or a database, so every decision can be replayed
from its inputs.

The steps, in order:

1. **Filter** (`eligibility`, `matches`): the agent ID, every requested tag, the capability
   type and every metadata rule must match, and an agent that declares capabilities must
   declare the method too (it is the capability invoked). A filter naming none of agent ID,
   tags or capability is refused when it is built -- a route is never a blind broadcast.
   Submission asks the same function, so what submit accepts delivery can route.
2. **Drop** what cannot take work: instances not routable (by the reachability verdict, or
   because their circuit breaker is open; see ``reach.core.flow.breakers``), and any status other
   than ONLINE or DEGRADED (offline, unreachable, deregistered).
3. **Demote, never remove**: instances at ``max_concurrency`` and DEGRADED ones go after all
   the others, so a capability whose instances are all busy still has a candidate (the agent
   answers 429 and delivery backs off) rather than failing with "no suitable agent".
4. **Rank** each tier by ReachScore (high first), then load (low first), then instance ID so
   the order is deterministic (what listings and semantic matching show as "best").
5. **Choose by expected wait** (seed 000 §5.3: "by ReachScore and current load"). The
   score is first a gate: the instances of the best tier within ``score_gate`` points of
   its best score compete (a flaky one far below never does while better ones exist).
   Each then weighs ``1 / cost``, where ``cost`` is its expected wait -- one task's
   service time (the heartbeat's ``last_task_duration_ms``, else the capability's
   ``estimated_latency``, else one unit) times its occupancy plus one slot's share
   (``in_flight / max_concurrency``, or the heartbeat's ``current_load`` when higher,
   ``+ 1 / max_concurrency``) -- divided by the score as a fraction (so the score is also
   a weight) and by its ``recovery`` share (an instance whose breaker just closed takes a
   growing share, ``reach.core.flow.breakers.recovery_share``). One weighted draw picks: equal
   replicas share the work evenly at any count, an idle replica takes most of it from a
   busy one with a slightly better score, and a stale load (heartbeats come every few
   seconds) never sends everything one way.

Metadata rules compare strictly by kind: a string never equals a number (``"1" != 1``) and a
bool never equals a number (``True != 1``), while ints and floats compare by value
(``1 == 1.0``), as they do once they have been through JSON.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias

from reach.core.fleet.health import InstanceStatus
from reach.errors import NoSuitableAgent

__all__ = [
    "DEFAULT_SCORE_GATE",
    "DEFAULT_TIE_MARGIN",
    "Candidate",
    "Declaration",
    "Declared",
    "Eligible",
    "MetadataValue",
    "RouteFilter",
    "choose",
    "choose_excluding",
    "eligibility",
    "expected_cost",
    "matches",
    "rank",
    "tier",
]

MetadataValue: TypeAlias = str | int | float | bool

DEFAULT_TIE_MARGIN: Final = 5.0  # agents within this many points are equally apt (matching)
DEFAULT_SCORE_GATE: Final = 20.0  # instances within this many points compete on expected wait

_ROUTABLE_STATUSES: Final = frozenset({InstanceStatus.ONLINE, InstanceStatus.DEGRADED})


@dataclass(frozen=True, slots=True)
class RouteFilter:
    """What a task asks for: an agent ID, tags (all required), a capability, metadata rules,
    or an intent (words matched to a capability by meaning: ``reach.core.fleet.matching``).

    At least one of `agent_id`, `tags`, `capability` or `intent` must be given; `rules` only
    narrow a selection, they never make one on their own. Eligibility ignores `intent`: the
    meaning is judged among the agents the other fields let through.
    """

    agent_id: str | None = None
    tags: tuple[str, ...] = ()
    capability: str | None = None
    rules: tuple[tuple[str, MetadataValue], ...] = ()
    intent: str | None = None

    def __post_init__(self) -> None:
        # A bare string would be iterated character by character: tags="gpu" -> g, p, u.
        if isinstance(self.tags, str):
            raise ValueError(f"tags: must be a tuple of tags, not the string {self.tags!r}")
        if isinstance(self.rules, str) or any(
            not isinstance(rule, tuple) or len(rule) != 2 for rule in self.rules
        ):
            raise ValueError(f"rules: must be (key, value) pairs, got {self.rules!r}")
        if not (self.agent_id or self.tags or self.capability or self.intent):
            raise ValueError(
                "a route filter needs agent_id, tags, capability or intent "
                "(never a blind broadcast)"
            )

    def describe(self) -> str:
        """Human text naming the filter, e.g. ``agent_id=doc-1, tags=[doc,gpu], region=east``."""
        parts: list[str] = []
        if self.agent_id:
            parts.append(f"agent_id={self.agent_id}")
        if self.tags:
            parts.append(f"tags=[{','.join(self.tags)}]")
        if self.capability:
            parts.append(f"capability={self.capability}")
        parts.extend(f"{key}={value}" for key, value in self.rules)
        if self.intent:
            parts.append(f"intent={self.intent!r}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One registered instance as routing sees it, with its reachability verdict."""

    instance_id: str
    agent_id: str
    endpoint: str
    status: InstanceStatus
    routable: bool
    reach_score: float
    in_flight: int
    max_concurrency: int
    tags: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    metadata: tuple[tuple[str, MetadataValue], ...] = ()
    breaker_open_until: float | None = None  # as the store said when this was loaded
    breaker_opened_at: float = 0.0
    breaker_closed_at: float | None = None  # its last successful trial (recovery ramps)
    recovery: float = 1.0  # the share it takes while recovering (reach.core.flow.breakers)
    trust_level: str = "L2"  # agents.trust_level: L1 (mTLS), L2 (default), L3 (allow-list)
    protocol: str = "reach"  # instances.protocol: reach (the SDK's POST) or a2a (JSON-RPC)
    current_load: float = 0.0  # the heartbeat's own view: in_flight / max_concurrency
    last_task_duration_ms: float | None = None  # the heartbeat's most recent task
    estimated_latency_ms: float | None = None  # the invoked capability's declaration
    # the agent's declaration of the capability the route's method invokes (its
    # params_schema and approval flags), None when it declares none: delivery checks the
    # chosen instance against it (``reach.hub.delivery.routing``)
    declaration: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def load(self) -> float:
        """in_flight / max_concurrency; infinite for a busy instance that declares no slots."""
        if self.max_concurrency <= 0:
            return math.inf if self.in_flight > 0 else 1.0
        return self.in_flight / self.max_concurrency

    @property
    def at_capacity(self) -> bool:
        """True when every slot is taken (in_flight >= max_concurrency)."""
        return self.in_flight >= self.max_concurrency


class Declared(Protocol):
    """What an agent declares about itself, as eligibility reads it (a `Candidate` is one)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def capabilities(self) -> tuple[str, ...]: ...  # the declared capability types
    @property
    def metadata(self) -> tuple[tuple[str, MetadataValue], ...]: ...


@dataclass(frozen=True, slots=True)
class Declaration:
    """An agent's declaration without an instance (what submission checks against)."""

    agent_id: str
    tags: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    metadata: tuple[tuple[str, MetadataValue], ...] = ()


@dataclass(frozen=True, slots=True)
class Eligible:
    """An agent may take the request; ``capability`` is the declared capability the
    method invokes (its ``params_schema`` applies), None when the agent declares none."""

    capability: str | None


_NO_SCHEMA: Final = Eligible(capability=None)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _rule_holds(metadata: Mapping[str, MetadataValue], key: str, wanted: MetadataValue) -> bool:
    if key not in metadata:
        return False
    actual = metadata[key]
    return _kind(actual) == _kind(wanted) and actual == wanted


def eligibility(decl: Declared, flt: RouteFilter, method: str | None) -> Eligible | None:
    """Whether the declared agent may take a request for ``method`` under ``flt``.

    The one eligibility rule, asked at submit time and when delivery loads candidates:
    every part of the filter that is set must match (metadata rules as the module
    docstring says), and an agent that declares capabilities must declare ``method``
    among them -- it would not know what to do with it otherwise. ``method=None``
    checks the filter alone. None when not eligible.
    """
    if flt.agent_id and decl.agent_id != flt.agent_id:
        return None
    if flt.tags and not set(flt.tags) <= set(decl.tags):
        return None
    if flt.capability and flt.capability not in decl.capabilities:
        return None
    if flt.rules:
        metadata = dict(decl.metadata)
        if not all(_rule_holds(metadata, key, wanted) for key, wanted in flt.rules):
            return None
    if not decl.capabilities or method is None:
        return _NO_SCHEMA
    return Eligible(capability=method) if method in decl.capabilities else None


def matches(c: Candidate, flt: RouteFilter) -> bool:
    """True when the candidate satisfies every part of the filter that is set."""
    return eligibility(c, flt, None) is not None


def tier(c: Candidate) -> int:
    """0 for an instance that can take work now, 1 for a demoted one (full or degraded)."""
    return 1 if c.at_capacity or c.status is InstanceStatus.DEGRADED else 0


def _rank_key(c: Candidate) -> tuple[int, float, float, str]:
    return (tier(c), -c.reach_score, c.load, c.instance_id)


def rank(candidates: Sequence[Candidate], flt: RouteFilter) -> list[Candidate]:
    """Matching, routable candidates, best first (see the module docstring for the order)."""
    eligible = [
        c for c in candidates if c.routable and c.status in _ROUTABLE_STATUSES and matches(c, flt)
    ]
    return sorted(eligible, key=_rank_key)


def _filter_dict(flt: RouteFilter) -> dict[str, Any]:
    """The filter as JSON-ready data, carried by NoSuitableAgent into the problem answer."""
    return {
        "agent_id": flt.agent_id,
        "tags": list(flt.tags),
        "capability": flt.capability,
        "rules": {key: value for key, value in flt.rules},
    }


def expected_cost(c: Candidate) -> float:
    """Expected wait for one more task, per unit of ReachScore: what the draw weighs
    against (lower is better; see the module docstring, step 5)."""
    service = c.last_task_duration_ms or c.estimated_latency_ms or 1.0
    slots = max(c.max_concurrency, 1)
    occupancy = max(c.load, c.current_load)
    if not math.isfinite(occupancy):
        return math.inf
    wait = max(service, 1e-3) * (occupancy + 1.0 / slots)
    return wait / max(c.reach_score / 100.0, 0.01) / max(c.recovery, 0.01)


def _pick(ranked: Sequence[Candidate], rng: random.Random, score_gate: float) -> Candidate:
    best = ranked[0]
    pool = [
        c
        for c in ranked
        if tier(c) == tier(best) and c.reach_score >= best.reach_score - score_gate
    ]
    if len(pool) == 1:
        return best
    weights = [1.0 / cost if (cost := expected_cost(c)) > 0 else 0.0 for c in pool]
    total = sum(weights)
    if not total > 0 or not math.isfinite(total):
        return best  # every one infinitely busy: the ranked order decides
    point = rng.random() * total
    for c, weight in zip(pool, weights, strict=True):
        point -= weight
        if point < 0:
            return c
    return pool[-1]


def _no_suitable_agent(flt: RouteFilter) -> NoSuitableAgent:
    return NoSuitableAgent(
        f"no routable instance matches {flt.describe()}", filter=_filter_dict(flt)
    )


def choose(
    candidates: Sequence[Candidate],
    flt: RouteFilter,
    rng: random.Random,
    score_gate: float = DEFAULT_SCORE_GATE,
) -> Candidate:
    """The instance to deliver to; raises NoSuitableAgent when nothing matches.

    Among the best tier's instances within `score_gate` points of its best, one is drawn
    with weight ``1 / expected_cost`` (one ``rng.random()``); a lone one is taken as is.
    """
    ranked = rank(candidates, flt)
    if not ranked:
        raise _no_suitable_agent(flt)
    return _pick(ranked, rng, score_gate)


def choose_excluding(
    candidates: Sequence[Candidate],
    flt: RouteFilter,
    rng: random.Random,
    exclude: Collection[str],
    score_gate: float = DEFAULT_SCORE_GATE,
) -> Candidate:
    """Like `choose`, but prefer instances whose ID is not in `exclude`.

    Used on retry to steer away from the instance that just failed. Any instance outside
    `exclude` beats every excluded one, even from a lower tier; when only excluded instances
    remain, one of them is chosen rather than failing. A bare string is taken as one ID.
    """
    excluded = {exclude} if isinstance(exclude, str) else set(exclude)
    ranked = rank(candidates, flt)
    if not ranked:
        raise _no_suitable_agent(flt)
    preferred = [c for c in ranked if c.instance_id not in excluded]
    return _pick(preferred or ranked, rng, score_gate)
