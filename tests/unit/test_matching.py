"""Tables for semantic matching's pure decisions (`reach.core.fleet.matching`): the texts a
capability is matched by, the hard filters, the threshold, meaning first and then
ReachScore and load, and the random pick between equally apt agents."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.matching import (
    NO_INSTANCE,
    Proposal,
    Standing,
    choose,
    intent_capabilities,
    rank,
    shown,
    standing_of,
    texts_digest,
    texts_for,
)
from reach.core.fleet.routing import Candidate, Declaration, RouteFilter
from reach.errors import NoSuitableAgent, RoutingError

UP = Standing(tier=0, reach_score=95.0, load=0.0)


def prop(
    agent: str, cap: str, sim: float, tier: int = 0, score: float = 95.0, load: float = 0.0
) -> Proposal:
    return Proposal(agent, cap, sim, Standing(tier=tier, reach_score=score, load=load))


def names(ranked: list[Proposal]) -> list[str]:
    return [f"{p.agent_id}/{p.capability}" for p in ranked]


@pytest.mark.parametrize(
    ("capability", "texts"),
    [
        ({"type": "orders.refund"}, ("orders refund",)),
        ({"type": "a-b/c:d_e"}, ("a b c d e",)),
        (
            {"type": "text.summarize", "description": " Summarise a text. ", "examples": ["tl;dr"]},
            ("text summarize", "Summarise a text.", "tl;dr"),
        ),
        ({"type": "x", "description": "", "examples": ["x", "  ", "y", "y"]}, ("x", "y")),
        ({"type": "x", "examples": None}, ("x",)),
    ],
)
def test_texts_of_a_capability(capability: dict[str, Any], texts: tuple[str, ...]) -> None:
    assert texts_for(capability) == texts


def test_digest_names_model_and_texts() -> None:
    base = texts_digest("m1", ("a", "b"))
    assert base == texts_digest("m1", ("a", "b"))
    assert len({base, texts_digest("m2", ("a", "b")), texts_digest("m1", ("b", "a"))}) == 3
    assert texts_digest("m1", ("ab",)) != texts_digest("m1", ("a", "b"))  # separated


DECL = Declaration(
    agent_id="sales",
    tags=("demo", "sales"),
    capabilities=("sales.fetch", "orders.cancel", "orders.refund"),
    metadata=(("region", "eu"),),
)
ALL = ["sales.fetch", "orders.cancel", "orders.refund"]


@pytest.mark.parametrize(
    ("flt", "method", "expected"),
    [
        (RouteFilter(intent="refund"), None, ALL),
        (RouteFilter(intent="refund", capability="orders.refund"), None, ["orders.refund"]),
        (RouteFilter(intent="refund"), "orders.cancel", ["orders.cancel"]),
        (RouteFilter(intent="refund", capability="orders.refund"), "orders.cancel", []),
        (RouteFilter(intent="refund", capability="text.summarize"), None, []),
        (RouteFilter(intent="refund", agent_id="sales"), None, ALL),
        (RouteFilter(intent="refund", agent_id="other"), None, []),
        (RouteFilter(intent="refund", tags=("sales",)), None, ALL),
        (RouteFilter(intent="refund", tags=("sales", "gpu")), None, []),
        (RouteFilter(intent="refund", rules=(("region", "eu"),)), None, ALL),
        (RouteFilter(intent="refund", rules=(("region", "us"),)), None, []),
        (RouteFilter(intent="x"), "no.such", []),
    ],
)
def test_hard_filters_decide_what_meaning_may_rank(
    flt: RouteFilter, method: str | None, expected: list[str]
) -> None:
    assert intent_capabilities(DECL, flt, method) == expected


def test_an_agent_without_capabilities_offers_nothing_to_match() -> None:
    assert intent_capabilities(Declaration(agent_id="bare"), RouteFilter(intent="x"), None) == []


def test_an_intent_alone_is_a_filter_and_says_so() -> None:
    flt = RouteFilter(intent="refund a damaged order", tags=("demo",))
    assert "intent='refund a damaged order'" in flt.describe()
    with pytest.raises(ValueError, match="intent"):
        RouteFilter(rules=(("region", "eu"),))


def inst(
    iid: str,
    score: float = 90.0,
    *,
    status: InstanceStatus = InstanceStatus.ONLINE,
    routable: bool = True,
    in_flight: int = 0,
    max_concurrency: int = 4,
) -> Candidate:
    return Candidate(
        instance_id=iid,
        agent_id="a",
        endpoint=f"http://10.0.0.1/{iid}",
        status=status,
        routable=routable,
        reach_score=score,
        in_flight=in_flight,
        max_concurrency=max_concurrency,
        capabilities=("c",),
    )


@pytest.mark.parametrize(
    ("instances", "standing"),
    [
        ([], NO_INSTANCE),
        ([inst("i1", routable=False)], NO_INSTANCE),
        ([inst("i1", status=InstanceStatus.OFFLINE)], NO_INSTANCE),
        ([inst("i1", 80.0, in_flight=1)], Standing(0, 80.0, 0.25)),
        ([inst("i1", 80.0), inst("i2", 90.0, in_flight=2)], Standing(0, 90.0, 0.5)),
        # the best instance that can take work, before a better-scored full one
        ([inst("i1", 99.0, in_flight=4), inst("i2", 60.0)], Standing(0, 60.0, 0.0)),
        ([inst("i1", 99.0, in_flight=4)], Standing(1, 99.0, 1.0)),
        ([inst("i1", 70.0, status=InstanceStatus.DEGRADED)], Standing(1, 70.0, 0.0)),
    ],
)
def test_standing_is_the_best_instance_as_routing_ranks_it(
    instances: list[Candidate], standing: Standing
) -> None:
    assert standing_of(instances) == standing


@pytest.mark.parametrize(
    ("proposals", "threshold", "margin", "expected"),
    [
        # meaning first: a clear gap in similarity beats any health
        (
            [prop("a", "x", 0.80, score=20.0), prop("b", "y", 0.70, score=100.0)],
            0.5,
            0.03,
            ["a/x", "b/y"],
        ),
        # within the margin: equally apt, the healthier agent first
        (
            [prop("a", "x", 0.80, score=60.0), prop("b", "y", 0.78, score=100.0)],
            0.5,
            0.03,
            ["b/y", "a/x"],
        ),
        # ... and the one that can take work now before a demoted (full) one
        (
            [prop("a", "x", 0.80, tier=1, score=100.0), prop("b", "y", 0.79, score=50.0)],
            0.5,
            0.03,
            ["b/y", "a/x"],
        ),
        # ... and one with a routable instance before one without any
        (
            [prop("a", "x", 0.80, tier=2, score=0.0), prop("b", "y", 0.79, tier=1, score=10.0)],
            0.5,
            0.03,
            ["b/y", "a/x"],
        ),
        # same health: lower load, then the closer meaning
        (
            [prop("a", "x", 0.80, load=0.5), prop("b", "y", 0.79, load=0.1)],
            0.5,
            0.03,
            ["b/y", "a/x"],
        ),
        (
            [prop("a", "x", 0.79), prop("a", "y", 0.80)],
            0.5,
            0.03,
            ["a/y", "a/x"],
        ),
        # outside the margin: by similarity, whatever the health
        (
            [
                prop("a", "x", 0.90),
                prop("b", "y", 0.60, score=100.0),
                prop("c", "z", 0.70, tier=1),
            ],
            0.5,
            0.03,
            ["a/x", "c/z", "b/y"],
        ),
        # below the threshold: never a candidate
        (
            [prop("a", "x", 0.49), prop("b", "y", 0.51)],
            0.5,
            0.03,
            ["b/y"],
        ),
        # exactly at the threshold: a candidate
        ([prop("a", "x", 0.5)], 0.5, 0.0, ["a/x"]),
        # margin 0: only equal similarities are equally apt
        (
            [prop("a", "x", 0.80, score=10.0), prop("b", "y", 0.7999, score=100.0)],
            0.5,
            0.0,
            ["a/x", "b/y"],
        ),
        # a margin reaching below the threshold takes only what is above it
        (
            [prop("a", "x", 0.55, score=10.0), prop("b", "y", 0.45, score=100.0)],
            0.5,
            0.2,
            ["a/x"],
        ),
    ],
)
def test_rank_combines_meaning_with_reach_score_and_load(
    proposals: list[Proposal], threshold: float, margin: float, expected: list[str]
) -> None:
    assert names(rank(proposals, threshold, margin)) == expected


@pytest.mark.parametrize(
    ("proposals", "threshold", "closest"),
    [
        ([], 0.5, []),
        ([prop("a", "x", 0.2)], 0.5, [("a", "x", 0.2)]),
        (
            [prop("a", "x", 0.2), prop("b", "y", 0.45), prop("c", "z", -0.1)],
            0.5,
            [("b", "y", 0.45), ("a", "x", 0.2), ("c", "z", -0.1)],
        ),
        ([prop("a", "x", 0.89999)], 0.9, [("a", "x", 0.9)]),  # shown rounded, still refused
    ],
)
def test_below_the_threshold_no_suitable_agent_with_the_closest_and_scores(
    proposals: list[Proposal], threshold: float, closest: list[tuple[str, str, float]]
) -> None:
    with pytest.raises(NoSuitableAgent) as refused:
        rank(proposals, threshold, intent="play some jazz")
    error = refused.value
    assert isinstance(error, RoutingError) and error.status == 404
    assert error.extra["intent"] == "play some jazz"
    assert error.extra["threshold"] == threshold
    assert error.extra["candidates"] == [
        {"agent_id": a, "capability": c, "score": s} for a, c, s in closest
    ]
    assert "play some jazz" in error.detail and "no suitable agent" in error.detail
    problem = error.to_problem()
    assert problem["type"] == "urn:agent-reach:problem:no-suitable-agent"
    assert problem["candidates"] == error.extra["candidates"]


def test_a_refusal_names_at_most_five_closest() -> None:
    many = [prop(f"a{i}", "x", 0.1 + i / 100) for i in range(9)]
    with pytest.raises(NoSuitableAgent) as refused:
        rank(many, 0.5)
    assert [c["agent_id"] for c in refused.value.extra["candidates"]] == [
        "a8",
        "a7",
        "a6",
        "a5",
        "a4",
    ]
    assert shown(many, limit=2) == refused.value.extra["candidates"][:2]


class Drawn(random.Random):
    """A random source that records what it was asked to choose between."""

    def __init__(self, pick: int) -> None:
        super().__init__(0)
        self.pick = pick
        self.asked: list[tuple[Any, ...]] = []

    def choice(self, seq: Any) -> Any:
        self.asked.append(tuple(seq))
        return seq[self.pick]


@pytest.mark.parametrize(
    ("proposals", "drawn_between"),
    [
        # two agents, equally apt, same tier, within 5 ReachScore points: drawn
        ([prop("a", "x", 0.80, score=95.0), prop("b", "x", 0.79, score=91.0)], ["a/x", "b/x"]),
        # exactly 5 points apart: still drawn (inclusive, as routing)
        ([prop("a", "x", 0.80, score=95.0), prop("b", "y", 0.80, score=90.0)], ["a/x", "b/y"]),
        # more than 5 points apart: the healthier one
        ([prop("a", "x", 0.80, score=95.0), prop("b", "x", 0.80, score=89.9)], None),
        # different tiers: never drawn
        ([prop("a", "x", 0.80, score=95.0), prop("b", "x", 0.80, tier=1, score=95.0)], None),
        # the second outside the margin: never drawn
        ([prop("a", "x", 0.80), prop("b", "y", 0.70)], None),
        # two capabilities of one agent: the closer meaning, never drawn
        ([prop("a", "x", 0.80), prop("a", "y", 0.79)], None),
        # alone
        ([prop("a", "x", 0.80)], None),
    ],
)
def test_choose_draws_only_between_equally_apt_agents(
    proposals: list[Proposal], drawn_between: list[str] | None
) -> None:
    rng = Drawn(pick=1)
    chosen = choose(proposals, rng, 0.5, 0.03)
    ranked = rank(proposals, 0.5, 0.03)
    if drawn_between is None:
        assert rng.asked == [] and chosen == ranked[0]
    else:
        assert [names(list(a)) for a in rng.asked] == [drawn_between]
        assert chosen == ranked[1]


def test_choose_spreads_between_two_tied_agents() -> None:
    tied = [prop("a", "x", 0.8, score=95.0), prop("b", "x", 0.8, score=93.0)]
    rng = random.Random(7)
    picks = Counter(choose(tied, rng).agent_id for _ in range(400))
    assert set(picks) == {"a", "b"} and min(picks.values()) > 120


def test_choose_refuses_like_rank() -> None:
    with pytest.raises(NoSuitableAgent):
        choose([prop("a", "x", 0.3)], random.Random(1), threshold=0.5)


def test_proposal_wire_form() -> None:
    assert Proposal("a", "orders.refund", 0.734567, UP).shown() == {
        "agent_id": "a",
        "capability": "orders.refund",
        "score": 0.7346,
    }
