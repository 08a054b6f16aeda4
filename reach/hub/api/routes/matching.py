"""``GET /v1/match``: which agents' capabilities an intent (words) matches, best first.

The same matching a send with ``intent`` does (`reach.hub.fleet.matching`), without sending:
the candidates at or above ``router.semantic_threshold``, ranked by meaning, then
ReachScore and load. Below the threshold: ``404 no-suitable-agent`` with the closest
candidates and their scores; on a hub without the model: ``501 semantic-matching-off``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from reach.core.fleet.routing import RouteFilter
from reach.core.security.auth import Action, Principal
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.wire.schemas import MatchCandidate, MatchResponse

Submits = Annotated[Principal, Depends(require(Action.SUBMIT))]

MAX_LIMIT = 50


def match_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/v1/match", tags=["tasks"])

    @router.get("", response_model=MatchResponse, responses={404: {}, 422: {}, 501: {}})
    async def match(
        principal: Submits,
        intent: Annotated[str, Query(min_length=1, max_length=1000, pattern=r"\S")],
        agent_id: str | None = None,
        tag: Annotated[list[str] | None, Query()] = None,
        capability: str | None = None,
        method: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 5,
    ) -> MatchResponse:
        """Candidates for ``intent`` among the agents the other parameters allow (the
        same hard filters as a send: agent, every ``tag``, capability, method)."""
        matcher = ctx.matcher
        matcher.require()
        flt = RouteFilter(
            agent_id=agent_id,
            tags=tuple(sorted(set(tag or ()))),
            capability=capability,
            intent=intent,
        )

        def work() -> MatchResponse:
            with ctx.reading() as session:
                ranked = matcher.match(session, flt, method, ctx.clock.now())
            return MatchResponse(
                intent=intent,
                threshold=matcher.threshold,
                candidates=[MatchCandidate(**p.shown()) for p in ranked[:limit]],
            )

        return await run_in_threadpool(work)

    return router
