"""Guessing keys (issue 37, item 15): failed authentications are limited per client
address, on bearer keys and on the dashboard's sign-in form alike, against a real
``reach api`` process. Clients are source addresses 127.0.0.<n> (`edge_hub`).

Before: 315 sign-ins and 676 bearer tries a second were each checked and answered 401.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reach.core.security.auth import Scope
from tests.security.edge_hub import EdgeHub, assert_problem, csrf_of, edge_hub

MAX, WINDOW = 5, 8
WRONG = "rk_000000000000_this-is-not-a-real-secret-at-all"
pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[EdgeHub]:
    limits = {
        "REACH_SECURITY__AUTH_FAILURES_MAX": str(MAX),
        "REACH_SECURITY__AUTH_FAILURES_WINDOW_S": str(WINDOW),
    }
    with edge_hub(store_url, tmp_path, **limits) as running:
        yield running


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_bearer_failures_lock_out_their_address_only_and_for_a_while(hub: EdgeHub) -> None:
    attacker, bystander = hub.client(2), hub.client(3)
    fleet = f"{hub.url}/api/v1/agents"
    started = time.monotonic()
    for _ in range(MAX):
        assert_problem(attacker.get(fleet, headers=bearer(WRONG)), 401, "unauthenticated")
    # a burst: not one more credential of this address is checked
    answers = [attacker.get(fleet, headers=bearer(WRONG)) for _ in range(100)]
    assert {a.status_code for a in answers} == {429}
    locked = assert_problem(answers[-1], 429, "too-many-auth-failures")
    assert "too many failed authentications" in locked["detail"]
    wait = int(answers[-1].headers["Retry-After"])
    assert 1 <= wait <= WINDOW
    # locked out means locked out: its own valid key waits as well (it is not checked)
    assert_problem(
        attacker.get(fleet, headers=bearer(hub.admin.secret)), 429, "too-many-auth-failures"
    )
    # a garbage header is a failure too, and refused the same while locked
    assert attacker.get(fleet, headers={"Authorization": "Basic eA=="}).status_code == 429

    # every other address, and its keys, carry on: valid and invalid alike
    assert bystander.get(fleet, headers=bearer(hub.admin.secret)).status_code == 200
    assert_problem(bystander.get(fleet, headers=bearer(WRONG)), 401, "unauthenticated")
    caller = hub.key(Scope.CALLER)
    assert (
        bystander.get(f"{hub.url}/v1/tasks/nope", headers=bearer(caller.secret)).status_code == 404
    )
    # no key at all is not a guess: still the 401 that says a key is needed
    assert_problem(hub.client(4).get(fleet), 401, "unauthenticated")

    # once the window has passed the failures, the address is heard again
    time.sleep(max(0.0, started + WINDOW + 0.5 - time.monotonic()))
    assert attacker.get(fleet, headers=bearer(hub.admin.secret)).status_code == 200
    assert_problem(attacker.get(fleet, headers=bearer(WRONG)), 401, "unauthenticated")


def test_failed_sign_ins_lock_out_their_address_only(hub: EdgeHub) -> None:
    attacker = hub.client(5)
    token = csrf_of(attacker.get(f"{hub.url}/ui/login", timeout=10).text)
    login = f"{hub.url}/ui/login"

    def attempt(secret: str) -> tuple[int, str, str | None]:
        r = attacker.post(
            login,
            data={"api_key": secret, "next": "/ui", "csrf_token": token},
            allow_redirects=False,
        )
        return r.status_code, r.text, r.headers.get("Retry-After")

    for _ in range(MAX):
        assert attempt(WRONG)[0] == 401
    status, page, retry_after = attempt(WRONG)
    assert status == 429 and retry_after is not None and 1 <= int(retry_after) <= WINDOW
    assert "too many failed authentications from this address" in page
    assert attempt(hub.admin.secret)[0] == 429  # its valid key is not checked meanwhile
    # ... and the same record covers the API: this address's bearer keys wait too
    locked = attacker.get(f"{hub.url}/api/v1/agents", headers=bearer(hub.admin.secret))
    assert_problem(locked, 429, "too-many-auth-failures")

    # a person at another address signs in as usual
    person = hub.client(6)
    form = csrf_of(person.get(login, timeout=10).text)
    fields = {"api_key": hub.admin.secret, "next": "/ui", "csrf_token": form}
    assert person.post(login, data=fields, allow_redirects=False).status_code == 303


def test_an_empty_field_or_a_key_of_another_scope_is_not_a_guess(hub: EdgeHub) -> None:
    """Only failed credentials count: a person who submits the form empty, or pastes a
    caller key, is told why and is never locked out for it."""
    browser = hub.client(7)
    token = csrf_of(browser.get(f"{hub.url}/ui/login", timeout=10).text)
    caller = hub.key(Scope.CALLER)
    for secret in ["", caller.secret] * MAX:
        fields = {"api_key": secret, "next": "/ui", "csrf_token": token}
        assert browser.post(f"{hub.url}/ui/login", data=fields).status_code == 401
    fields = {"api_key": hub.admin.secret, "next": "/ui", "csrf_token": token}
    assert (
        browser.post(f"{hub.url}/ui/login", data=fields, allow_redirects=False).status_code == 303
    )
