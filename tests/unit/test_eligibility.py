"""The one eligibility rule that submission and delivery both ask (reach.core.fleet.routing)."""

from __future__ import annotations

import pytest

from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.routing import (
    Candidate,
    Declaration,
    Eligible,
    MetadataValue,
    RouteFilter,
    eligibility,
    matches,
)

DOC = Declaration(
    agent_id="doc-1",
    tags=("doc", "gpu"),
    capabilities=("summarise", "translate"),
    metadata=(("region", "east"), ("shard", 1), ("ratio", 0.5), ("pii", False)),
)
PLAIN = Declaration(agent_id="plain", tags=("doc",))  # declares no capability at all


SUMMARISE = Eligible("summarise")


def doc(*rules: tuple[str, MetadataValue]) -> RouteFilter:
    """Tag ``doc`` narrowed by metadata rules."""
    return RouteFilter(tags=("doc",), rules=rules)


@pytest.mark.parametrize(
    ("decl", "flt", "method", "expected"),
    [
        # the method must be declared when the agent declares capabilities
        (DOC, RouteFilter(agent_id="doc-1"), "summarise", Eligible("summarise")),
        (DOC, RouteFilter(agent_id="doc-1"), "ocr", None),
        # ... also when the capability asked for is declared (submit used to accept this)
        (DOC, RouteFilter(capability="summarise"), "translate", Eligible("translate")),
        (DOC, RouteFilter(capability="summarise"), "ocr", None),
        (DOC, RouteFilter(capability="ocr"), "summarise", None),
        # an agent that declares nothing takes any method, with no schema to check
        (PLAIN, RouteFilter(agent_id="plain"), "anything", Eligible(None)),
        (PLAIN, RouteFilter(capability="summarise"), "summarise", None),
        # method=None asks about the filter alone
        (DOC, RouteFilter(capability="summarise"), None, Eligible(None)),
        # agent id and tags
        (DOC, RouteFilter(agent_id="doc-2"), "summarise", None),
        (DOC, RouteFilter(tags=("gpu", "doc")), "summarise", Eligible("summarise")),
        (DOC, RouteFilter(tags=("doc", "cpu")), "summarise", None),
        # metadata rules: numbers by value, never across kinds
        (DOC, doc(("shard", 1)), "summarise", SUMMARISE),
        (DOC, doc(("shard", 1.0)), "summarise", SUMMARISE),
        (DOC, doc(("ratio", 0.5)), "summarise", SUMMARISE),
        (DOC, doc(("shard", "1")), "summarise", None),
        (DOC, doc(("shard", True)), "summarise", None),
        (DOC, doc(("pii", 0)), "summarise", None),
        (DOC, doc(("pii", False)), "summarise", SUMMARISE),
        (DOC, doc(("zone", "a")), "summarise", None),
        (DOC, doc(("region", "east"), ("shard", 2)), "summarise", None),
    ],
)
def test_eligibility(
    decl: Declaration, flt: RouteFilter, method: str | None, expected: Eligible | None
) -> None:
    assert eligibility(decl, flt, method) == expected


@pytest.mark.parametrize(("wanted", "declared"), [(1, True), (True, 1), (0, False), (1.0, True)])
def test_a_bool_never_equals_a_number(wanted: MetadataValue, declared: MetadataValue) -> None:
    decl = Declaration(agent_id="a", metadata=(("flag", declared),))
    assert eligibility(decl, RouteFilter(agent_id="a", rules=(("flag", wanted),)), "m") is None


def test_a_candidate_is_judged_by_the_same_rule() -> None:
    """Routing's `matches` is eligibility of the candidate's declaration, method aside."""
    c = Candidate(
        instance_id="i-1",
        agent_id=DOC.agent_id,
        endpoint="http://10.0.0.1",
        status=InstanceStatus.ONLINE,
        routable=True,
        reach_score=90.0,
        in_flight=0,
        max_concurrency=4,
        tags=DOC.tags,
        capabilities=DOC.capabilities,
        metadata=DOC.metadata,
    )
    for flt in (
        RouteFilter(tags=("doc",), rules=(("shard", 1.0),)),
        RouteFilter(tags=("doc",), rules=(("shard", True),)),
        RouteFilter(capability="ocr"),
    ):
        assert matches(c, flt) is (eligibility(DOC, flt, None) is not None)
        assert eligibility(c, flt, "summarise") == eligibility(DOC, flt, "summarise")
