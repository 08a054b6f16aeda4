"""The routing candidate cache keeps a bounded number of filters (least recently used go),
on a real store: filters come from submitted tasks, so their number has no natural bound."""

from __future__ import annotations

from sqlalchemy import Engine

from reach.core.fleet.routing import RouteFilter
from reach.hub.clock import ManualClock
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.fleet.registry import CandidateCache
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.wire.schemas import RegisterRequest

POLICY = Policy.from_settings(Settings())


def test_candidate_cache_is_bounded_by_count_and_keeps_the_recent(engine: Engine) -> None:
    sessions = session_factory(engine)
    clock = ManualClock()
    with sessions.begin() as s:
        registry.register(
            s,
            RegisterRequest(agent_id="a", addr="127.0.0.1:9", allow_loopback=True, tags=["t"]),
            clock.now(),
            POLICY,
        )
    cache = CandidateCache(ttl=60, maxsize=4)
    hot = RouteFilter(tags=("t",))
    with sessions() as s:
        kept = cache.get(s, hot, clock.now(), POLICY, None)
        cold = RouteFilter(tags=("t",), rules=(("n", -1),))
        cold_first = cache.get(s, cold, clock.now(), POLICY, None)
        for i in range(40):  # every distinct metadata rule is a new key
            cache.get(s, RouteFilter(tags=("t",), rules=(("n", i),)), clock.now(), POLICY, None)
            assert cache.get(s, hot, clock.now(), POLICY, None) is kept  # used: stays cached
        assert len(cache) == 4
        assert cache.get(s, cold, clock.now(), POLICY, None) is not cold_first  # evicted
