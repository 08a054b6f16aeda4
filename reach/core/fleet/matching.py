"""Semantic capability matching: which declared capability an intent (words) asks for.

Rule-based routing stays first and authoritative: only capabilities of agents that pass
the hard filters (agent ID, tags, capability, metadata rules, method) are proposed here,
each with its cosine similarity to the intent (computed by the hub's embedding provider
over the texts of `texts_for`: the capability's type, description and examples; the best
text counts). What is decided here, as pure functions:

1. **Threshold**: a proposal below ``threshold`` is never taken. When none is at or above
   it, the answer is `NoSuitableAgent` carrying the best proposals and their scores -- the
   hub says "no suitable agent" instead of guessing.
2. **Meaning first, then reachability**: every proposal within ``margin`` of the best
   similarity is *equally apt* (a difference that small is the model's noise, not
   meaning); among those, routing's own order decides -- the agent's best instance's tier
   (able to take work now, demoted, none routable), ReachScore high, load low -- then the
   higher similarity. Proposals outside the margin follow by similarity.
3. **Spread**: when the best two equally apt proposals are different agents in the same
   tier within ``tie_margin`` ReachScore points, one of the two is drawn at random, as
   routing does between instances (`reach.core.fleet.routing`). Two capabilities of one agent
   never tie this way: the closer meaning wins.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from reach.core.fleet.routing import (
    DEFAULT_TIE_MARGIN,
    Candidate,
    Declared,
    RouteFilter,
    eligibility,
    tier,
)
from reach.core.fleet.routing import rank as rank_instances
from reach.errors import NoSuitableAgent

__all__ = [
    "DEFAULT_MARGIN",
    "DEFAULT_THRESHOLD",
    "NO_INSTANCE",
    "Proposal",
    "Standing",
    "choose",
    "intent_capabilities",
    "rank",
    "shown",
    "standing_of",
    "texts_digest",
    "texts_for",
]

DEFAULT_THRESHOLD: Final = 0.5
DEFAULT_MARGIN: Final = 0.03
SHOWN: Final = 5  # proposals named in a refusal


@dataclass(frozen=True, slots=True)
class Standing:
    """An agent's best instance as routing ranks it: tier 0 can take work now, 1 is
    demoted (full or degraded), 2 has no routable instance at all."""

    tier: int
    reach_score: float
    load: float


NO_INSTANCE: Final = Standing(tier=2, reach_score=0.0, load=0.0)


@dataclass(frozen=True, slots=True)
class Proposal:
    """One capability of one agent, with its similarity to the intent."""

    agent_id: str
    capability: str
    similarity: float
    standing: Standing = NO_INSTANCE

    def shown(self) -> dict[str, Any]:
        """The wire form: ``{"agent_id", "capability", "score"}``."""
        return {
            "agent_id": self.agent_id,
            "capability": self.capability,
            "score": round(self.similarity, 4),
        }


_SEPARATORS = re.compile(r"[._:/-]+")


def texts_for(capability: Mapping[str, Any]) -> tuple[str, ...]:
    """The texts a capability is matched by: its type in words (``orders.refund`` ->
    ``orders refund``), its description and each declared example, without repeats."""
    texts = [_SEPARATORS.sub(" ", str(capability["type"])).strip()]
    description = str(capability.get("description") or "").strip()
    if description:
        texts.append(description)
    texts.extend(str(e).strip() for e in capability.get("examples") or ())
    return tuple(dict.fromkeys(t for t in texts if t))


def texts_digest(model: str, texts: Sequence[str]) -> str:
    """Names the vectors of ``texts`` under ``model``: stored vectors whose digest differs
    (the declaration or the model changed) are stale."""
    h = hashlib.sha256(model.encode())
    for text in texts:
        h.update(b"\0" + text.encode())
    return h.hexdigest()


def intent_capabilities(decl: Declared, flt: RouteFilter, method: str | None) -> list[str]:
    """The capabilities of ``decl`` an intent may be matched against under the hard
    filters: all it declares, narrowed to ``flt.capability`` and ``method`` when given;
    none when the agent fails the filter (`reach.core.fleet.routing.eligibility`)."""
    out = []
    for capability in decl.capabilities:
        if flt.capability and capability != flt.capability:
            continue
        if method and capability != method:
            continue
        if eligibility(decl, flt, capability) is not None:
            out.append(capability)
    return out


def standing_of(instances: Sequence[Candidate]) -> Standing:
    """The standing of an agent from its instances: its best routable one by routing's
    order (`reach.core.fleet.routing.rank`), or `NO_INSTANCE`."""
    if not instances:
        return NO_INSTANCE
    best = rank_instances(instances, RouteFilter(agent_id=instances[0].agent_id))
    if not best:
        return NO_INSTANCE
    top = best[0]
    return Standing(tier=tier(top), reach_score=top.reach_score, load=top.load)


def _by_health(p: Proposal) -> tuple[int, float, float, float, str, str]:
    s = p.standing
    return (s.tier, -s.reach_score, s.load, -p.similarity, p.agent_id, p.capability)


def _by_meaning(p: Proposal) -> tuple[float, int, float, float, str, str]:
    s = p.standing
    return (-p.similarity, s.tier, -s.reach_score, s.load, p.agent_id, p.capability)


def shown(proposals: Iterable[Proposal], limit: int = SHOWN) -> list[dict[str, Any]]:
    """The best ``limit`` proposals by similarity alone, in wire form (for a refusal)."""
    return [p.shown() for p in sorted(proposals, key=_by_meaning)[:limit]]


def _refusal(proposals: Sequence[Proposal], threshold: float, intent: str) -> NoSuitableAgent:
    best = shown(proposals)
    if best:
        top = best[0]
        why = (
            f"the closest is {top['capability']} of {top['agent_id']} at {top['score']:.2f}, "
            f"below the threshold {threshold:g}"
        )
    else:
        why = "no agent the filters allow declares a capability to match it against"
    return NoSuitableAgent(
        f"no suitable agent for the intent {intent!r}: {why}",
        intent=intent,
        threshold=threshold,
        candidates=best,
    )


def rank(
    proposals: Sequence[Proposal],
    threshold: float = DEFAULT_THRESHOLD,
    margin: float = DEFAULT_MARGIN,
    *,
    intent: str = "",
) -> list[Proposal]:
    """The proposals at or above ``threshold``, best first (module docstring, steps 1-2);
    raises `NoSuitableAgent` (with the best proposals and their scores) when none is."""
    above = [p for p in proposals if p.similarity >= threshold]
    if not above:
        raise _refusal(proposals, threshold, intent)
    best = max(p.similarity for p in above)
    apt = [p for p in above if p.similarity >= best - margin]
    rest = [p for p in above if p.similarity < best - margin]
    return sorted(apt, key=_by_health) + sorted(rest, key=_by_meaning)


def choose(
    proposals: Sequence[Proposal],
    rng: random.Random,
    threshold: float = DEFAULT_THRESHOLD,
    margin: float = DEFAULT_MARGIN,
    tie_margin: float = DEFAULT_TIE_MARGIN,
    *,
    intent: str = "",
) -> Proposal:
    """The proposal a send takes (module docstring, steps 1-3)."""
    ranked = rank(proposals, threshold, margin, intent=intent)
    best = ranked[0]
    if len(ranked) >= 2:
        second = ranked[1]
        tied = (
            second.agent_id != best.agent_id
            and second.similarity >= max(p.similarity for p in ranked) - margin
            and second.standing.tier == best.standing.tier
            and best.standing.reach_score - second.standing.reach_score <= tie_margin
        )
        if tied:
            return rng.choice((best, second))
    return best
