"""Tables for pure route selection: filter matching, dropping, demotion, ranking, spreading."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.routing import (
    Candidate,
    RouteFilter,
    choose,
    choose_excluding,
    expected_cost,
    matches,
    rank,
)
from reach.errors import NoSuitableAgent, RoutingError

ONLINE = InstanceStatus.ONLINE
DEGRADED = InstanceStatus.DEGRADED


def cand(
    instance_id: str,
    score: float = 90.0,
    *,
    agent_id: str = "doc",
    status: InstanceStatus = ONLINE,
    routable: bool = True,
    in_flight: int = 0,
    max_concurrency: int = 8,
    tags: tuple[str, ...] = ("doc",),
    capabilities: tuple[str, ...] = ("summarise",),
    metadata: tuple[tuple[str, str | int | float | bool], ...] = (),
) -> Candidate:
    return Candidate(
        instance_id=instance_id,
        agent_id=agent_id,
        endpoint=f"http://10.0.0.1/{instance_id}",
        status=status,
        routable=routable,
        reach_score=score,
        in_flight=in_flight,
        max_concurrency=max_concurrency,
        tags=tags,
        capabilities=capabilities,
        metadata=metadata,
    )


BY_CAP = RouteFilter(capability="summarise")


def ids(candidates: list[Candidate]) -> list[str]:
    return [c.instance_id for c in candidates]


# --- RouteFilter -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"rules": (("region", "east"),)},  # rules only narrow, they never select
        {"agent_id": ""},
        {"agent_id": None, "tags": (), "capability": None},
    ],
)
def test_filter_with_nothing_to_select_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="blind broadcast"):
        RouteFilter(**kwargs)


def test_filter_refuses_a_bare_string_as_tags() -> None:
    with pytest.raises(ValueError, match="tags"):
        RouteFilter(tags="gpu")  # type: ignore[arg-type]


def test_filter_refuses_malformed_rules() -> None:
    with pytest.raises(ValueError, match="rules"):
        RouteFilter(capability="x", rules=(("region",),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flt", "text"),
    [
        (RouteFilter(agent_id="doc-1"), "agent_id=doc-1"),
        (RouteFilter(tags=("doc", "gpu")), "tags=[doc,gpu]"),
        (RouteFilter(capability="x"), "capability=x"),
        (
            RouteFilter(
                agent_id="doc-1",
                tags=("doc", "gpu"),
                capability="x",
                rules=(("region", "east"), ("tier", 2)),
            ),
            "agent_id=doc-1, tags=[doc,gpu], capability=x, region=east, tier=2",
        ),
    ],
)
def test_describe(flt: RouteFilter, text: str) -> None:
    assert flt.describe() == text


# --- matches ---------------------------------------------------------------------------------

BASE = cand(
    "i-1",
    agent_id="doc-1",
    tags=("doc", "gpu", "fast"),
    capabilities=("summarise", "translate"),
    metadata=(("region", "east"), ("shard", 1), ("ratio", 0.5), ("pii", False)),
)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        # agent id
        (RouteFilter(agent_id="doc-1"), True),
        (RouteFilter(agent_id="doc-2"), False),
        # tags: every requested tag must be present
        (RouteFilter(tags=("doc",)), True),
        (RouteFilter(tags=("gpu", "doc")), True),
        (RouteFilter(tags=("doc", "gpu", "fast")), True),
        (RouteFilter(tags=("doc", "cpu")), False),
        (RouteFilter(tags=("cpu",)), False),
        # capability
        (RouteFilter(capability="translate"), True),
        (RouteFilter(capability="ocr"), False),
        # metadata rules
        (RouteFilter(capability="summarise", rules=(("region", "east"),)), True),
        (RouteFilter(capability="summarise", rules=(("region", "west"),)), False),
        (RouteFilter(capability="summarise", rules=(("zone", "a"),)), False),  # key absent
        (RouteFilter(capability="summarise", rules=(("shard", 1),)), True),
        (RouteFilter(capability="summarise", rules=(("shard", "1"),)), False),  # "1" != 1
        (RouteFilter(capability="summarise", rules=(("shard", 1.0),)), True),  # 1 == 1.0
        (RouteFilter(capability="summarise", rules=(("shard", True),)), False),  # True != 1
        (RouteFilter(capability="summarise", rules=(("pii", False),)), True),
        (RouteFilter(capability="summarise", rules=(("pii", 0),)), False),  # 0 != False
        (RouteFilter(capability="summarise", rules=(("ratio", 0.5),)), True),
        (RouteFilter(capability="summarise", rules=(("region", "east"), ("shard", 1))), True),
        (RouteFilter(capability="summarise", rules=(("region", "east"), ("shard", 2))), False),
        # all parts together
        (RouteFilter(agent_id="doc-1", tags=("gpu",), capability="translate"), True),
        (RouteFilter(agent_id="doc-1", tags=("gpu",), capability="ocr"), False),
        (RouteFilter(agent_id="doc-2", tags=("gpu",), capability="translate"), False),
    ],
)
def test_matches(flt: RouteFilter, expected: bool) -> None:
    assert matches(BASE, flt) is expected


def test_string_metadata_does_not_match_a_numeric_rule() -> None:
    c = cand("i-1", metadata=(("shard", "1"),))
    assert not matches(c, RouteFilter(capability="summarise", rules=(("shard", 1),)))
    assert matches(c, RouteFilter(capability="summarise", rules=(("shard", "1"),)))


# --- Candidate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_flight", "max_concurrency", "load", "at_capacity"),
    [
        (0, 8, 0.0, False),
        (2, 8, 0.25, False),
        (7, 8, 0.875, False),
        (8, 8, 1.0, True),
        (9, 8, 1.125, True),
        (0, 0, 1.0, True),  # no slots declared: full, and no division by zero
    ],
)
def test_load_and_capacity(
    in_flight: int, max_concurrency: int, load: float, at_capacity: bool
) -> None:
    c = cand("i-1", in_flight=in_flight, max_concurrency=max_concurrency)
    assert c.load == pytest.approx(load)
    assert c.at_capacity is at_capacity


# --- rank: dropping --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "routable", "kept"),
    [
        (InstanceStatus.ONLINE, True, True),
        (InstanceStatus.DEGRADED, True, True),
        (InstanceStatus.ONLINE, False, False),  # e.g. consecutive failures >= 3
        (InstanceStatus.DEGRADED, False, False),
        (InstanceStatus.UNREACHABLE, True, False),
        (InstanceStatus.UNREACHABLE, False, False),
        (InstanceStatus.OFFLINE, True, False),
        (InstanceStatus.OFFLINE, False, False),
        (InstanceStatus.DEREGISTERED, True, False),
    ],
)
def test_rank_drops_what_cannot_take_work(
    status: InstanceStatus, routable: bool, kept: bool
) -> None:
    ranked = rank([cand("i-1", status=status, routable=routable)], BY_CAP)
    assert ids(ranked) == (["i-1"] if kept else [])


def test_rank_drops_non_matching_candidates() -> None:
    pool = [cand("i-1"), cand("i-2", capabilities=("ocr",)), cand("i-3")]
    assert ids(rank(pool, BY_CAP)) == ["i-1", "i-3"]


# --- rank: ordering and demotion -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        # score, high first
        ([cand("a", 70), cand("b", 95), cand("c", 80)], ["b", "c", "a"]),
        # equal score: load, low first
        (
            [cand("a", 90, in_flight=6), cand("b", 90, in_flight=1), cand("c", 90, in_flight=3)],
            ["b", "c", "a"],
        ),
        # load compares as a fraction of max_concurrency, not raw in_flight
        (
            [
                cand("a", 90, in_flight=2, max_concurrency=4),
                cand("b", 90, in_flight=3, max_concurrency=12),
            ],
            ["b", "a"],
        ),
        # score beats load
        ([cand("a", 91, in_flight=7), cand("b", 90, in_flight=0)], ["a", "b"]),
        # full tie: instance id keeps it deterministic
        ([cand("c", 90), cand("a", 90), cand("b", 90)], ["a", "b", "c"]),
        # at capacity is demoted below a lower score
        ([cand("full", 99, in_flight=8), cand("free", 40)], ["free", "full"]),
        # degraded is demoted below a lower score
        ([cand("deg", 99, status=DEGRADED), cand("ok", 40)], ["ok", "deg"]),
        # demoted instances are still ranked among themselves by score then load
        (
            [
                cand("d1", 60, status=DEGRADED),
                cand("f1", 80, in_flight=8),
                cand("ok", 10),
                cand("f2", 80, in_flight=9, max_concurrency=8),
            ],
            ["ok", "f1", "f2", "d1"],
        ),
    ],
)
def test_rank_order(pool: list[Candidate], expected: list[str]) -> None:
    assert ids(rank(pool, BY_CAP)) == expected


def test_rank_ignores_input_order() -> None:
    pool = [cand("a", 70), cand("b", 95), cand("c", 80, status=DEGRADED), cand("d", 95)]
    expected = ids(rank(pool, BY_CAP))
    for seed in range(20):
        shuffled = pool[:]
        random.Random(seed).shuffle(shuffled)
        assert ids(rank(shuffled, BY_CAP)) == expected


# --- choose: capacity and degraded -----------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        # at capacity skipped while another can take it, even a much worse one
        ([cand("full", 99, in_flight=8), cand("free", 30)], "free"),
        # at capacity kept when it is the only one: demote, never remove
        ([cand("full", 99, in_flight=8)], "full"),
        # all at capacity: the best of them
        ([cand("f1", 99, in_flight=8), cand("f2", 50, in_flight=8)], "f1"),
        # degraded skipped while a healthy one exists
        ([cand("deg", 99, status=DEGRADED), cand("ok", 30)], "ok"),
        # degraded kept when it is the only one
        ([cand("deg", 99, status=DEGRADED)], "deg"),
        # an unroutable healthy instance does not shadow a demoted routable one
        ([cand("gone", 99, routable=False), cand("full", 50, in_flight=8)], "full"),
    ],
)
def test_choose_demotes_but_never_removes(pool: list[Candidate], expected: str) -> None:
    rng = random.Random(0)
    for _ in range(50):
        assert choose(pool, BY_CAP, rng).instance_id == expected


# --- choose: by expected wait, spread fairly ---------------------------------------------------


def shares(pool: list[Candidate], draws: int = 20_000, seed: int = 20240601) -> dict[str, float]:
    rng = random.Random(seed)
    counts = Counter(choose(pool, BY_CAP, rng).instance_id for _ in range(draws))
    return {c.instance_id: counts[c.instance_id] / draws for c in pool}


@pytest.mark.parametrize("replicas", [2, 3, 5, 10])
def test_equal_replicas_share_the_work_evenly_at_any_count(replicas: int) -> None:
    got = shares([cand(f"r{n}", 95) for n in range(replicas)])
    for share in got.values():
        assert share == pytest.approx(1 / replicas, abs=0.02)


def test_an_idle_replica_takes_most_work_from_a_busy_one_with_a_better_score() -> None:
    """Issue 39's case: score 99 with 7 of 8 slots taken against an idle score 90."""
    got = shares([cand("busy", 99, in_flight=7), cand("idle", 90)])
    assert got["idle"] == pytest.approx(0.879, abs=0.02)  # 1/cost: 7.2 against 0.99
    assert got["busy"] > 0  # a stale load never sends everything one way


@pytest.mark.parametrize(
    ("scores", "allowed"),
    [
        ((97.0, 76.0), {"i0"}),  # 21 points below the best: gated out
        ((97.0, 77.0), {"i0", "i1"}),  # exactly 20: competes
        ((97.0, 95.0, 94.0), {"i0", "i1", "i2"}),  # every near-equal one shares the work
        ((97.0, 96.0, 96.0, 60.0), {"i0", "i1", "i2"}),
    ],
)
def test_score_gate(scores: tuple[float, ...], allowed: set[str]) -> None:
    pool = [cand(f"i{n}", score) for n, score in enumerate(scores)]
    rng = random.Random(7)
    seen = {choose(pool, BY_CAP, rng).instance_id for _ in range(2_000)}
    assert seen == allowed


def test_recent_task_duration_counts() -> None:
    fast = replace(cand("fast", 95), last_task_duration_ms=1_000.0)
    slow = replace(cand("slow", 95), last_task_duration_ms=4_000.0)
    assert shares([fast, slow])["fast"] == pytest.approx(0.8, abs=0.02)


def test_declared_latency_stands_in_until_a_heartbeat_reports_a_duration() -> None:
    declared = replace(cand("declared", 95), estimated_latency_ms=3_000.0)
    measured = replace(
        cand("measured", 95), estimated_latency_ms=3_000.0, last_task_duration_ms=1_000.0
    )
    assert shares([declared, measured])["measured"] == pytest.approx(0.75, abs=0.02)


def test_the_heartbeats_current_load_counts_when_higher_than_in_flight() -> None:
    loaded = replace(cand("loaded", 95), current_load=0.875)  # busy with work of its own
    assert shares([loaded, cand("idle", 95)])["idle"] == pytest.approx(0.889, abs=0.02)


@pytest.mark.parametrize(
    ("candidate", "cost"),
    [
        (cand("idle", 100), 1 / 8),
        (cand("half", 100, in_flight=4), 5 / 8),
        (cand("half-score", 50), 2 / 8),
        (replace(cand("slow", 100), last_task_duration_ms=2_000.0), 2_000 / 8),
        (replace(cand("self-busy", 100), current_load=1.0), 9 / 8),
        (cand("no-slots", 100, in_flight=1, max_concurrency=0), float("inf")),
        (cand("zero-score", 0), 100 / 8),  # floored at a hundredth
    ],
    ids=lambda v: v.instance_id if isinstance(v, Candidate) else None,
)
def test_expected_cost(candidate: Candidate, cost: float) -> None:
    assert expected_cost(candidate) == pytest.approx(cost)


@pytest.mark.parametrize(("recovery", "expected"), [(0.25, 0.2), (0.5, 1 / 3), (1.0, 0.5)])
def test_an_instance_recovering_from_its_breaker_takes_its_share(
    recovery: float, expected: float
) -> None:
    back = replace(cand("back", 95), recovery=recovery)
    assert shares([back, cand("steady", 95)])["back"] == pytest.approx(expected, abs=0.02)


def test_no_spreading_across_tiers() -> None:
    # The full instance scores better but is in a lower tier: it gets nothing.
    pool = [cand("free", 95), cand("full", 99, in_flight=8)]
    rng = random.Random(1)
    assert {choose(pool, BY_CAP, rng).instance_id for _ in range(500)} == {"free"}


def test_custom_score_gate() -> None:
    pool = [cand("a", 97), cand("b", 90)]
    rng = random.Random(3)
    assert {choose(pool, BY_CAP, rng, score_gate=10).instance_id for _ in range(500)} == {
        "a",
        "b",
    }
    assert {choose(pool, BY_CAP, rng, score_gate=0).instance_id for _ in range(500)} == {"a"}


def test_choose_is_reproducible_with_the_same_seed() -> None:
    pool = [cand("a", 97), cand("b", 95)]
    rng1, rng2 = random.Random(42), random.Random(42)
    run1 = [choose(pool, BY_CAP, rng1).instance_id for _ in range(100)]
    run2 = [choose(pool, BY_CAP, rng2).instance_id for _ in range(100)]
    assert run1 == run2


def test_single_candidate_draws_nothing() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert choose([cand("only", 80)], BY_CAP, rng).instance_id == "only"
    assert rng.getstate() == state


# --- choose: nothing to route to -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "flt"),
    [
        ([], BY_CAP),
        ([cand("i-1")], RouteFilter(capability="ocr")),
        ([cand("i-1", status=InstanceStatus.OFFLINE)], BY_CAP),
        ([cand("i-1", routable=False)], BY_CAP),
        ([cand("i-1", status=InstanceStatus.UNREACHABLE)], BY_CAP),
        (
            [cand("i-1", metadata=(("region", "west"),))],
            RouteFilter(capability="summarise", rules=(("region", "east"),)),
        ),
    ],
)
def test_no_suitable_agent(pool: list[Candidate], flt: RouteFilter) -> None:
    with pytest.raises(NoSuitableAgent) as info:
        choose(pool, flt, random.Random(0))
    with pytest.raises(NoSuitableAgent):
        choose_excluding(pool, flt, random.Random(0), exclude=set())
    assert flt.describe() in str(info.value)


def test_no_suitable_agent_names_the_filter() -> None:
    flt = RouteFilter(
        agent_id="doc-1", tags=("doc", "gpu"), capability="x", rules=(("region", "east"),)
    )
    with pytest.raises(NoSuitableAgent) as info:
        choose([], flt, random.Random(0))
    err = info.value
    assert isinstance(err, RoutingError)
    assert err.detail == (
        "no routable instance matches agent_id=doc-1, tags=[doc,gpu], capability=x, region=east"
    )
    assert err.extra["filter"] == {
        "agent_id": "doc-1",
        "tags": ["doc", "gpu"],
        "capability": "x",
        "rules": {"region": "east"},
    }
    # the filter travels in the problem answer, so it must be JSON
    problem = err.to_problem()
    assert json.loads(json.dumps(problem))["filter"]["rules"] == {"region": "east"}


# --- choose_excluding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "exclude", "allowed"),
    [
        # the failed best is avoided
        ([cand("a", 99), cand("b", 60)], {"a"}, {"b"}),
        # nothing excluded: same as choose
        ([cand("a", 99), cand("b", 60)], set(), {"a"}),
        # excluding an unknown id changes nothing
        ([cand("a", 99), cand("b", 60)], {"zzz"}, {"a"}),
        # a demoted instance outside the set beats an excluded healthy one
        ([cand("a", 99), cand("b", 99, in_flight=8)], {"a"}, {"b"}),
        # only excluded instances left: fall back rather than fail
        ([cand("a", 99), cand("b", 60)], {"a", "b"}, {"a"}),
        ([cand("a", 99)], ["a"], {"a"}),
        # the near-tie spread applies among the remaining ones
        ([cand("a", 99), cand("b", 97), cand("c", 95)], ("a",), {"b", "c"}),
        # a bare string is one instance id, not a set of characters
        ([cand("a", 99), cand("b", 60)], "a", {"b"}),
        ([cand("ab", 99), cand("b", 60)], "a", {"ab"}),
    ],
)
def test_choose_excluding(pool: list[Candidate], exclude: Any, allowed: set[str]) -> None:
    rng = random.Random(11)
    seen = {choose_excluding(pool, BY_CAP, rng, exclude).instance_id for _ in range(500)}
    assert seen == allowed


def test_choose_excluding_still_drops_unroutable() -> None:
    pool = [cand("a", 99), cand("b", 90, routable=False)]
    assert choose_excluding(pool, BY_CAP, random.Random(0), {"a"}).instance_id == "a"


def test_candidate_is_frozen() -> None:
    c = cand("a")
    with pytest.raises(AttributeError):
        c.in_flight = 3  # type: ignore[misc]
    assert replace(c, in_flight=3).in_flight == 3
