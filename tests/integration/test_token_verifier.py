"""The SDK's `TokenVerifier` against a real hub API process (its JWKS) and a closed port."""

from __future__ import annotations

import time

import pytest

from reach.hub.security import signing
from reach.hub.storage import create_engine_for, session_factory
from reach.sdk.hub_client import HubClient
from reach.sdk.tokens import TokenVerifier
from tests.support.listeners import closed_port
from tests.support.reach_tokens import bearer, encoded, mint

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def body(task_id: str) -> dict[str, object]:
    return {"task_id": task_id, "attempt_seq": 1, "payload": {}}


def check(verifier: TokenVerifier, store_url: str, task_id: str) -> object:
    raw = encoded(body(task_id))
    token = mint(store_url, audience="billing", task_id=task_id, body=raw)
    return verifier.check(bearer(token)["Authorization"], body(task_id), method="work.do", raw=raw)


def test_a_hub_out_of_reach_means_retry_not_refused(store_url: str) -> None:
    """The token may be good; the agent cannot tell yet: 503, which the hub retries."""
    hub = HubClient(f"http://127.0.0.1:{closed_port()}", api_key="", connect_timeout=1)
    verifier = TokenVerifier(hub, "billing")
    raw = encoded(body("t-1"))
    token = mint(store_url, audience="billing", task_id="t-1", body=raw)
    refusal = verifier.check(f"Bearer {token}", body("t-1"), method="work.do", raw=raw)
    assert refusal is not None and refusal.status == 503
    assert refusal.message == "cannot check the reach token: the hub's keys are unavailable"
    hub.close()


def test_keys_published_ahead_are_learnt_by_age_not_by_a_miss(store_url: str, hub_api: str) -> None:
    """A graceful rotation publishes the next key first: an agent whose cached set is older
    than ``max_age`` fetches it again, so it knows the key before the key signs."""
    timer = [0.0]
    hub = HubClient(hub_api, api_key="")
    fetches: list[str] = []
    real_get = hub.get

    def counting_get(path: str, *a: object, **kw: object) -> dict[str, object]:
        fetches.append(path)
        return real_get(path, *a, **kw)  # type: ignore[arg-type]

    hub.get = counting_get  # type: ignore[method-assign]
    verifier = TokenVerifier(hub, "billing", max_age=60, timer=lambda: timer[0])
    assert check(verifier, store_url, "a") is None
    engine = create_engine_for(store_url)
    with session_factory(engine).begin() as session:
        ahead = signing.rotate(session, time.time(), grace_s=300)
    engine.dispose()
    timer[0] = 30  # fresh: the cache answers
    assert check(verifier, store_url, "b") is None
    assert len(fetches) == 1
    timer[0] = 61  # stale: fetched again on the next check, the new key with it
    assert check(verifier, store_url, "c") is None
    assert len(fetches) == 2
    assert ahead["kid"] in verifier._keys
    hub.close()
