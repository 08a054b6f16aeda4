"""``reach keys`` on the hub host and ``--api-key`` on the client commands, against a hub of
real processes that requires keys, on both stores."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_sdk_credentials import (
    Key,
    KeyedAgent,
    assert_no_secret,
    create_key,
    get,
    online,
    reach_cli,
)
from tests.support.stacks import Stack, hub_env
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
AGENT = "kc-worker"


@pytest.fixture(scope="module")
def admin(shared_stack: Stack) -> Key:
    return create_key(shared_stack.env, "admin", "--name", "ops")


@pytest.fixture(scope="module")
def agent(
    shared_stack: Stack, admin: Key, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeyedAgent]:
    key = create_key(shared_stack.env, "agent", "--agent-id", AGENT)
    started = KeyedAgent(shared_stack.url, AGENT, key, tmp_path_factory.mktemp("agent"))
    try:
        wait_until(lambda: online(shared_stack, admin, AGENT), 30, what=f"{AGENT} online")
        yield started
    finally:
        started.stop()
    assert_no_secret(started.output(), key, admin)


def listed(stack: Stack) -> dict[str, dict[str, object]]:
    done = reach_cli(stack.env, "keys", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {k["key_id"]: k for k in json.loads(done.stdout)["keys"]}


# -- reach keys ------------------------------------------------------------------------------


def test_create_prints_the_secret_once_on_the_last_line(shared_stack: Stack) -> None:
    done = reach_cli(shared_stack.env, "keys", "create", "--scope", "viewer", "--name", "grafana")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    secret = lines[-1]
    assert secret.startswith("rk_") and len(lines) > 1
    assert done.stdout.count(secret) == 1 and secret not in done.stderr
    key_id = secret.split("_")[1]
    assert key_id in lines[0] and "viewer" in lines[0]
    viewer = Key(key_id, secret, "viewer")
    assert get(f"{shared_stack.url}/api/v1/agents", viewer).status_code == 200
    assert get(f"{shared_stack.url}/api/v1/agents", None).status_code == 401

    # list shows it, never its secret nor the hash the store keeps
    table = reach_cli(shared_stack.env, "keys", "list")
    as_json = reach_cli(shared_stack.env, "keys", "list", "--json")
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for out in (table.stdout, as_json.stdout):
        assert key_id in out and "grafana" in out
        assert secret not in out and digest not in out and secret.split("_", 2)[2] not in out
    view = listed(shared_stack)[key_id]
    assert view["scope"] == "viewer" and view["state"] == "active" and "secret" not in view
    assert not any("hash" in field for field in view)


def test_create_json_is_one_object_with_the_secret(shared_stack: Stack) -> None:
    done = reach_cli(
        shared_stack.env, "keys", "create", "--scope", "agent", "--agent-id", "kc-*", "--json"
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)  # the whole of stdout is the object
    assert body["scope"] == "agent" and body["agent_pattern"] == "kc-*"
    assert body["secret"].startswith(f"rk_{body['key_id']}_") and body["expires_at"] is None
    assert listed(shared_stack)[body["key_id"]]["agent_pattern"] == "kc-*"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "agent"], "--agent-id"),
        (["--scope", "caller", "--agent-id", "a-1"], "--agent-id is only for --scope agent"),
        (["--scope", "admin", "--expires-in", "0"], "--expires-in must be a positive"),
        (["--scope", "admin", "--expires-in", "soon"], "Invalid value for '--expires-in'"),
        (["--scope", "superuser"], "superuser"),
        (["--scope", "caller", "--name", "n" * 200], "name longer than"),
    ],
)
def test_create_refuses_bad_input_with_exit_2_and_stores_nothing(
    shared_stack: Stack, args: list[str], message: str
) -> None:
    before = listed(shared_stack)
    done = reach_cli(shared_stack.env, "keys", "create", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "rk_" not in done.stdout
    assert listed(shared_stack) == before


def test_an_expiring_key_stops_working_when_it_expires(shared_stack: Stack) -> None:
    done = reach_cli(
        shared_stack.env,
        "keys",
        "create",
        "--scope",
        "viewer",
        "--json",
        "--expires-in",
        str(5 / 86_400),  # 5 s
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    key = Key(body["key_id"], body["secret"], "viewer")
    assert body["expires_at"] == pytest.approx(body["created_at"] + 5, abs=0.01)
    if time.time() < body["expires_at"] - 1:
        assert get(f"{shared_stack.url}/api/v1/agents", key).status_code == 200
    time.sleep(max(0.0, body["expires_at"] - time.time()) + 0.2)
    refused = get(f"{shared_stack.url}/api/v1/agents", key)
    assert refused.status_code == 401
    assert refused.json()["type"] == "urn:agent-reach:problem:unauthenticated"
    assert listed(shared_stack)[key.key_id]["state"] == "expired"


def test_revoke_takes_effect_at_once(shared_stack: Stack) -> None:
    key = create_key(shared_stack.env, "viewer")
    url = f"{shared_stack.url}/api/v1/agents"
    assert get(url, key).status_code == 200
    done = reach_cli(shared_stack.env, "keys", "revoke", key.key_id)
    assert done.returncode == 0, done.stderr
    assert f"revoked key {key.key_id}" in done.stdout
    refused = get(url, key)  # the very next request, no cache to wait out
    assert refused.status_code == 401
    assert refused.json()["type"] == "urn:agent-reach:problem:unauthenticated"
    assert listed(shared_stack)[key.key_id]["state"] == "revoked"

    again = reach_cli(shared_stack.env, "keys", "revoke", key.key_id)
    assert again.returncode == 0 and "already revoked" in again.stdout


def test_revoke_of_an_unknown_key_exits_1(shared_stack: Stack) -> None:
    done = reach_cli(shared_stack.env, "keys", "revoke", "0123456789abcdef")
    assert done.returncode == 1
    assert "UnknownKey" in done.stderr and "0123456789abcdef" in done.stderr


def test_revoke_given_a_secret_revokes_its_key_without_echoing_it(shared_stack: Stack) -> None:
    key = create_key(shared_stack.env, "caller")
    done = reach_cli(shared_stack.env, "keys", "revoke", key.secret)
    assert done.returncode == 0, done.stderr
    assert key.secret not in done.stdout + done.stderr
    assert listed(shared_stack)[key.key_id]["state"] == "revoked"


def test_rotate_signing_publishes_a_new_key(shared_stack: Stack) -> None:
    jwks = f"{shared_stack.url}/.well-known/jwks.json"

    def kids() -> set[str]:
        return {k["kid"] for k in get(jwks, None).json()["keys"]}

    before = kids()
    at_once = reach_cli(shared_stack.env, "keys", "rotate-signing", "--now")
    assert at_once.returncode == 0, at_once.stderr
    (first,) = kids() - before
    assert f"new signing key {first} published; it signs reach tokens from now" in at_once.stdout

    graceful = reach_cli(shared_stack.env, "keys", "rotate-signing")
    assert graceful.returncode == 0, graceful.stderr
    (second,) = kids() - before - {first}
    assert second in graceful.stdout and "(in 30" in graceful.stdout  # the 300 s grace
    assert first in kids()  # still published: it signs until the new key starts
    assert "PRIVATE" not in at_once.stdout + graceful.stdout  # a view, never key material


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "list"],
        ["keys", "create", "--scope", "admin"],
        ["keys", "revoke", "0123456789abcdef"],
        ["keys", "rotate-signing"],
    ],
)
def test_keys_refuse_a_store_that_is_not_migrated(tmp_path: Path, args: list[str]) -> None:
    env = hub_env(f"sqlite:///{tmp_path / 'empty.db'}", tmp_path)
    done = reach_cli(env, *args)
    assert done.returncode == 2
    assert "database not ready" in done.stderr and "reach db upgrade" in done.stderr
    assert "rk_" not in done.stdout


# -- --api-key on the client commands ------------------------------------------------------


def test_send_with_api_key_works_and_a_wrong_key_exits_with_one_clear_line(
    shared_stack: Stack, admin: Key, agent: KeyedAgent
) -> None:
    caller = create_key(shared_stack.env, "caller")
    hub = ["--hub", shared_stack.url]
    send = ["send", "work.do", "--agent", AGENT, "--payload", '{"n": 7}', *hub]
    done = reach_cli(shared_stack.env, *send, "--api-key", caller.secret)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"echo": {"n": 7}, "by": AGENT}

    via_env = reach_cli({**shared_stack.env, "REACH_API_KEY": caller.secret}, *send)
    assert via_env.returncode == 0, via_env.stderr

    wrong = f"rk_{caller.key_id}_{'w' * 43}"
    viewer = create_key(shared_stack.env, "viewer")
    for key, error in (
        (wrong, "Unauthenticated: invalid API key"),
        ("", "Unauthenticated"),
        (viewer.secret, "Forbidden"),
    ):
        refused = reach_cli(shared_stack.env, *send, "--api-key", key)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stdout == ""
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(error), refused.stderr
        if key:
            assert key not in refused.stderr and key.split("_", 2)[2] not in refused.stderr
    assert_no_secret(done.stdout + done.stderr, caller, admin)

    # a key that is not even shaped like a header value is bad input, not echoed
    broken = reach_cli(shared_stack.env, *send, "--api-key", "rk_abc def\tghi")
    assert broken.returncode == 2 and "abc def" not in broken.stderr


def test_the_other_client_commands_take_the_key(
    shared_stack: Stack, admin: Key, agent: KeyedAgent
) -> None:
    hub = ["--hub", shared_stack.url]
    sent = reach_cli(
        shared_stack.env, "send", "work.do", "--agent", AGENT, *hub, "--api-key", admin.secret
    )
    assert sent.returncode == 0, sent.stderr
    task_id = json.loads(sent.stdout)["task_id"]
    for args in (
        ["tasks", "show", task_id],
        ["dlq", "list"],
        ["agents", "--json"],
    ):
        ok = reach_cli(shared_stack.env, *args, *hub, "--api-key", admin.secret)
        assert ok.returncode == 0, (args, ok.stderr)
        assert admin.secret not in ok.stdout
        refused = reach_cli(shared_stack.env, *args, *hub)
        assert refused.returncode == 1, (args, refused.stdout)
        assert refused.stderr.startswith("Unauthenticated"), refused.stderr
    agents = json.loads(
        reach_cli(shared_stack.env, "agents", "--json", *hub, "--api-key", admin.secret).stdout
    )
    assert AGENT in {a["agent_id"] for a in agents["agents"]}
