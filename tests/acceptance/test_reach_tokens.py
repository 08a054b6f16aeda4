"""Hub-signed reach tokens on every delivery, against real processes on both stores.

The hub (api, worker, beat) requires API keys; agents are ``agents/token_agent.py``
processes that verify tokens (the SDK default) and report, over HTTP, what they were
presented, what the SDK refused and how often their handlers ran. Every attack is a
request a test makes itself, straight to an agent's port: a missing, forged, expired,
misdirected or replayed token is answered 401 and no handler runs.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI

import reach
from reach.core.security.tokens import body_digest, claims_for
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.storage import create_engine_for, session_factory
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.reach_tokens import HubStore, bearer, encoded, hub_key, mint, sign
from tests.support.stacks import Stack
from tests.support.uvicorn_thread import uvicorn_serving
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
SCRIPT = REPO / "tests" / "acceptance" / "agents" / "token_agent.py"
TARGET = "tk-target"


@dataclass(frozen=True)
class Key:
    key_id: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


def create_key(env: dict[str, str], scope: str, *extra: str) -> Key:
    """A key made by ``reach keys create --json`` on the hub's store."""
    done = subprocess.run(
        [sys.executable, "-m", "reach", "keys", "create", "--scope", scope, "--json", *extra],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)
    return Key(body["key_id"], body["secret"])


class TokenAgent:
    """agents/token_agent.py as its own process, authenticating with ``key``."""

    def __init__(
        self,
        stack: Stack,
        agent_id: str,
        key: Key | None,
        directory: Path,
        *extra: str,
        admin: Key | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.port, self.stats_port = free_port(), free_port()
        self.output = directory / f"{agent_id}-{self.port}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        if key is not None:
            env["REACH_API_KEY"] = key.secret
        args = [
            sys.executable, str(SCRIPT), "--port", str(self.port),
            "--stats-port", str(self.stats_port), "--hub", stack.url, "--agent-id", agent_id,
            *extra,
        ]  # fmt: skip
        with self.output.open("ab") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=out)
        try:
            wait_until(lambda: self._online(stack, admin), timeout=30, what=f"{agent_id} online")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _online(self, stack: Stack, admin: Key | None) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.agent_id} exited:\n{self.output.read_text()}")
        headers = admin.headers if admin else {}
        r = requests.get(f"{stack.url}/api/v1/agents/{self.agent_id}", headers=headers, timeout=5)
        return r.ok and any(i["status"] == "online" for i in r.json().get("instances", []))

    def counts(self) -> dict[str, Any]:
        r = requests.get(f"http://127.0.0.1:{self.stats_port}/counts", timeout=5)
        return dict(r.json())

    def runs(self, task_id: str) -> int:
        return int(self.counts()["runs"].get(task_id, 0))

    def tokens(self, task_id: str) -> list[str]:
        """The tokens this agent was presented for ``task_id``, in order."""
        return [h.removeprefix("Bearer ") for h in self.counts()["presented"].get(task_id, [])]

    def post(
        self, task_id: str, headers: dict[str, str], raw: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        """A delivery made by the test itself, straight to this agent (``raw``: the
        body's bytes; by default `delivery` of the task)."""
        r = requests.post(
            f"{self.url}/tasks/work.do",
            data=delivery(task_id) if raw is None else raw,
            headers={"Content-Type": "application/json", **headers},
            timeout=10,
        )
        return r.status_code, r.json()

    def stop(self) -> None:
        processes.stop(self.proc)


@dataclass(frozen=True)
class Hub:
    stack: Stack
    admin: Key
    caller: Key

    @property
    def store_url(self) -> str:
        return self.stack.env["REACH_DATABASE_URL"]

    @property
    def store(self) -> HubStore:
        """The store with the hub's home: its signing key is sealed with the home's key."""
        return HubStore(self.store_url, self.stack.home)

    def agent_key(self, agent_id: str) -> Key:
        return create_key(self.stack.env, "agent", "--agent-id", agent_id)

    def agent(self, agent_id: str, directory: Path, *extra: str) -> TokenAgent:
        key = self.agent_key(agent_id)
        return TokenAgent(self.stack, agent_id, key, directory, *extra, admin=self.admin)

    def submit(self, agent_id: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        r = requests.post(
            f"{self.stack.url}/v1/tasks",
            params={"wait": 30},
            json={"agent_id": agent_id, "method": "work.do", "payload": payload or {"n": 1}},
            headers=self.caller.headers,
            timeout=40,
        )
        assert r.status_code == 201, r.text
        return dict(r.json())

    def rotate(self, *, immediate: bool, grace_s: float = 300) -> dict[str, Any]:
        engine = create_engine_for(self.store_url)
        try:
            with session_factory(engine).begin() as session:
                seal = SealKey.load(None, self.stack.home)  # the hub's, as `reach keys` has it
                return signing.rotate(session, time.time(), grace_s, immediate=immediate, seal=seal)
        finally:
            engine.dispose()

    def jwks_kids(self) -> list[str]:
        r = requests.get(f"{self.stack.url}/.well-known/jwks.json", timeout=5)  # no key: open
        assert r.status_code == 200, r.text
        return [k["kid"] for k in r.json()["keys"]]


@pytest.fixture(scope="module")
def hub(shared_stack: Stack) -> Hub:
    return Hub(
        shared_stack, create_key(shared_stack.env, "admin"), create_key(shared_stack.env, "caller")
    )


@pytest.fixture(scope="module")
def target(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenAgent]:
    agent = hub.agent(TARGET, tmp_path_factory.mktemp("target"))
    yield agent
    agent.stop()


def delivery(task_id: str, payload: dict[str, Any] | None = None) -> bytes:
    """The body a test posts for ``task_id``, encoded as the hub encodes one."""
    body = {"task_id": task_id, "method": "work.do", "payload": payload or {"n": 1}}
    return encoded({**body, "attempt_seq": 1})


def good_token(store_url: str | HubStore, task_id: str, **kw: Any) -> str:
    """The hub's token for `delivery` of ``task_id``; ``kw`` changes one thing of it."""
    return mint(store_url, audience=kw.pop("audience", TARGET), task_id=task_id,
                body=kw.pop("body", delivery(task_id)), **kw)  # fmt: skip


def bound(task_id: str) -> dict[str, str]:
    """``claims_for``'s binding of `delivery` of ``task_id`` (its method and digest)."""
    return {"method": "work.do", "body_sha256": body_digest(delivery(task_id))}


def claims_of(token: str) -> dict[str, Any]:
    return dict(jwt.decode(token, options={"verify_signature": False}))


def new_task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


# -- what the hub sends ----------------------------------------------------------------------


def test_every_delivery_carries_a_token_bound_to_caller_target_and_attempt(
    hub: Hub, target: TokenAgent
) -> None:
    view = hub.submit(TARGET, {"n": 7})
    assert view["status"] == "success", view
    assert view["result"] == {"echo": {"n": 7}, "by": TARGET}
    (token,) = target.tokens(view["task_id"])
    header = jwt.get_unverified_header(token)
    claims = claims_of(token)
    assert header["alg"] == "EdDSA"
    assert claims == {
        "iss": "agent-reach",
        "sub": f"key:{hub.caller.key_id}",
        "aud": TARGET,
        "task_id": view["task_id"],
        "attempt_seq": 1,
        "method": "work.do",
        "body_sha256": claims["body_sha256"],
        "iat": claims["iat"],
        "exp": claims["iat"] + 300,
        "jti": claims["jti"],
    }
    assert abs(claims["iat"] - time.time()) < 60
    # the JWKS is open, cacheable, and verifies the token
    r = requests.get(f"{hub.stack.url}/.well-known/jwks.json", timeout=5)
    assert r.headers["Cache-Control"] == "public, max-age=60"
    (jwk,) = [k for k in r.json()["keys"] if k["kid"] == header["kid"]]
    assert {k: jwk[k] for k in ("kty", "crv", "alg", "use")} == {
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "use": "sig",
    }
    assert "d" not in jwk  # the public half only
    key = jwt.PyJWK(jwk).key
    assert jwt.decode(token, key, algorithms=["EdDSA"], audience=TARGET) == claims
    # and each attempt gets a token of its own
    second = hub.submit(TARGET)
    assert claims_of(target.tokens(second["task_id"])[0])["jti"] != claims["jti"]


# -- what an agent refuses -----------------------------------------------------------------


def _forged_key_same_kid(store: HubStore, task_id: str) -> dict[str, str]:
    kid, _ = hub_key(store)
    claims = claims_for(
        "agent-reach", "anonymous", TARGET, task_id, 1, time.time(), 300, "j", **bound(task_id)
    )
    return bearer(sign(claims, kid, Ed25519PrivateKey.generate()))


def _alg_none(store: HubStore, task_id: str) -> dict[str, str]:
    kid, _ = hub_key(store)
    claims = claims_for(
        "agent-reach", "anonymous", TARGET, task_id, 1, time.time(), 300, "j", **bound(task_id)
    )
    return bearer(jwt.encode(claims, None, algorithm="none", headers={"kid": kid}))


def _hs256_with_the_public_key(store: HubStore, task_id: str) -> dict[str, str]:
    """The classic confusion: HMAC keyed with the published public key."""
    kid, key = hub_key(store)
    public = key.public_key().public_bytes_raw()
    claims = claims_for(
        "agent-reach", "anonymous", TARGET, task_id, 1, time.time(), 300, "j", **bound(task_id)
    )
    token = jwt.encode(claims, base64.urlsafe_b64encode(public), "HS256", headers={"kid": kid})
    return bearer(token)


Attack = Callable[[HubStore, str], dict[str, str]]
ATTACKS: list[tuple[str, Attack, str]] = [
    ("no token", lambda url, t: {}, "no reach token"),
    ("not a bearer", lambda url, t: {"Authorization": "Basic dXNlcjpwYXNz"}, "no reach token"),
    ("not a JWT", lambda url, t: bearer("not.a.jwt"), "malformed reach token"),
    ("forged signature", _forged_key_same_kid, "signature does not verify"),
    ("alg none", _alg_none, "not signed with EdDSA"),
    ("HS256 with the public key", _hs256_with_the_public_key, "not signed with EdDSA"),
    (
        "another audience",
        lambda url, t: bearer(good_token(url, t, audience="tk-someone-else")),
        "meant for another agent",
    ),
    (
        "expired",
        lambda url, t: bearer(good_token(url, t, iat=time.time() - 1000)),
        "token expired",
    ),
    (
        "another task",
        lambda url, t: bearer(good_token(url, t + "-other", body=delivery(t))),
        "token is for another task",
    ),
    (
        "another attempt",
        lambda url, t: bearer(good_token(url, t, attempt_seq=2)),
        "token is for another attempt",
    ),
    (
        "issued in the future",
        lambda url, t: bearer(good_token(url, t, iat=time.time() + 600)),
        "issued in the future",
    ),
]


@pytest.mark.parametrize(
    ("attack", "reason"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
def test_a_bad_token_is_refused_before_the_handler_runs(
    hub: Hub, target: TokenAgent, attack: Attack, reason: str
) -> None:
    task_id = new_task()
    status, body = target.post(task_id, attack(hub.store, task_id))
    assert status == 401, body
    assert body["code"] == 401 and reason in body["message"], body
    counts = target.counts()
    assert counts["runs"].get(task_id, 0) == 0
    assert counts["refused"][task_id] == [401]


def test_a_good_token_of_the_hub_is_accepted_once(hub: Hub, target: TokenAgent) -> None:
    """The control for the attacks above: the same request with a good token runs."""
    task_id = new_task()
    headers = bearer(good_token(hub.store, task_id))
    assert target.post(task_id, headers) == (
        200,
        {"code": 0, "data": {"echo": {"n": 1}, "by": TARGET}},
    )
    assert target.runs(task_id) == 1
    status, body = target.post(task_id, headers)
    assert (status, body["message"]) == (401, "reach token already used (replayed jti)")
    assert target.runs(task_id) == 1


def test_a_token_the_hub_delivered_cannot_be_replayed(hub: Hub, target: TokenAgent) -> None:
    view = hub.submit(TARGET)
    assert view["status"] == "success"
    task_id = view["task_id"]
    (token,) = target.tokens(task_id)
    (raw,) = target.counts()["bodies"][task_id]  # the very bytes it came with
    status, body = target.post(task_id, bearer(token), raw.encode())
    assert (status, body) == (
        401,
        {"code": 401, "message": "reach token already used (replayed jti)"},
    )
    assert target.runs(task_id) == 1


def test_refusals_are_logged_without_the_token(hub: Hub, target: TokenAgent) -> None:
    task_id = new_task()
    token = good_token(hub.store, task_id, audience="tk-elsewhere")
    assert target.post(task_id, bearer(token))[0] == 401
    signature = token.rsplit(".", 1)[1]

    def logged() -> str:
        return target.output.read_text()

    wait_until(lambda: task_id in logged(), timeout=5, what="the refusal in the agent's log")
    line = next(line for line in logged().splitlines() if task_id in line)
    assert "refused a delivery" in line and "meant for another agent" in line
    for log in [target.output, *(p.log_path for p in hub.stack.procs)]:
        assert signature not in log.read_text(errors="replace"), log


def test_a_forged_kid_is_refused_without_hammering_the_hub(hub: Hub, tmp_path: Path) -> None:
    agent = hub.agent(f"tk-fresh-{uuid.uuid4().hex[:6]}", tmp_path)
    try:
        mine = Ed25519PrivateKey.generate()

        def forged(task_id: str, kid: str) -> dict[str, str]:
            claims = claims_for(
                "agent-reach", "anonymous", agent.agent_id, task_id, 1, time.time(), 300, "j",
                **bound(task_id),
            )  # fmt: skip
            return bearer(sign(claims, kid, mine))

        first = new_task()
        status, body = agent.post(first, forged(first, "never-published"))
        assert (status, body["message"]) == (
            401,
            "reach token signed by a key the hub does not publish",
        )
        assert agent.counts()["jwks_fetches"] == 1
        tasks = [new_task() for _ in range(30)]
        answers = [agent.post(t, forged(t, uuid.uuid4().hex))[0] for t in tasks]
        # refused every time (503: "cannot tell yet" while the keys were just fetched);
        # the hub was asked again at most once more
        assert set(answers) <= {401, 503}, answers
        counts = agent.counts()
        assert counts["jwks_fetches"] <= 2, counts["jwks_fetches"]
        assert not any(counts["runs"].get(t) for t in [first, *tasks])
        # and the hub's own deliveries still verify
        assert hub.submit(agent.agent_id)["status"] == "success"
    finally:
        agent.stop()


def test_a_token_the_agent_refuses_fails_the_task_with_the_reason(hub: Hub, tmp_path: Path) -> None:
    """An agent pinned to another issuer refuses every token of this hub: the hub records
    the refusal as the task's terminal error (a retry would be refused alike)."""
    agent = hub.agent(f"tk-pinned-{uuid.uuid4().hex[:6]}", tmp_path, "--issuer", "another-hub")
    try:
        view = hub.submit(agent.agent_id)
        assert view["status"] == "failed", view
        assert view["error"]["http_status"] == 401
        assert view["error"]["message"] == (
            "agent refused the hub's reach token: token issued by another issuer"
        )
        counts = agent.counts()
        assert counts["refused"][view["task_id"]] == [401]  # one attempt, not retried
        assert counts["runs"].get(view["task_id"], 0) == 0
    finally:
        agent.stop()


# -- never forwarded -----------------------------------------------------------------------


def _forwarding_chain(
    hub: Hub | None, stack: Stack, directory: Path, tag: str
) -> tuple[TokenAgent, TokenAgent, TokenAgent]:
    """A forwards to B through the hub; B presents the token it got to C itself."""
    names = [f"tk-{tag}-{n}" for n in "abc"]

    def start(agent_id: str, *extra: str) -> TokenAgent:
        if hub is not None:
            return hub.agent(agent_id, directory, *extra)
        return TokenAgent(stack, agent_id, None, directory, *extra)

    c = start(names[2])
    b = start(names[1], "--mode", "relay", "--relay-to", c.url)
    a = start(names[0], "--mode", "forward", "--forward-to", names[1])
    return a, b, c


def _check_forwarded(
    a: TokenAgent, b: TokenAgent, c: TokenAgent, view: dict[str, Any], a_sub: str, b_sub: str
) -> None:
    assert view["status"] == "success", view
    inner_task = view["result"]["inner_task_id"]
    relayed = view["result"]["inner"]
    # C refused B's replay of the token meant for B, and never ran its handler
    assert relayed["relayed_status"] == 401, relayed
    assert relayed["relayed_answer"]["message"] == (
        f"token is meant for another agent, not {c.agent_id!r}"
    )
    assert c.counts()["refused"][inner_task] == [401]
    assert c.runs(inner_task) == 0
    # each hop got a token of its own: A's for the caller, B's for A
    (a_token,) = a.tokens(view["task_id"])
    (b_token,) = b.tokens(inner_task)
    assert (claims_of(a_token)["sub"], claims_of(a_token)["aud"]) == (a_sub, a.agent_id)
    assert (claims_of(b_token)["sub"], claims_of(b_token)["aud"]) == (b_sub, b.agent_id)
    assert claims_of(b_token)["task_id"] == inner_task
    assert c.tokens(inner_task) == [b_token]


def test_a_token_is_never_forwarded(hub: Hub, tmp_path: Path) -> None:
    a, b, c = _forwarding_chain(hub, hub.stack, tmp_path, "fw")
    try:
        view = hub.submit(a.agent_id, {"n": 3})
        _check_forwarded(a, b, c, view, f"key:{hub.caller.key_id}", f"agent:{a.agent_id}")
    finally:
        for agent in (a, b, c):
            agent.stop()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_on_an_open_hub_tokens_name_the_anonymous_caller(stack: Stack, tmp_path: Path) -> None:
    a, b, c = _forwarding_chain(None, stack, tmp_path, "open")
    try:
        r = requests.post(
            f"{stack.url}/v1/tasks",
            params={"wait": 30},
            json={"agent_id": a.agent_id, "method": "work.do", "payload": {"n": 1}},
            timeout=40,
        )
        assert r.status_code == 201, r.text
        _check_forwarded(a, b, c, r.json(), "anonymous", "anonymous")
    finally:
        for agent in (a, b, c):
            agent.stop()


# -- rotation --------------------------------------------------------------------------------


def test_rotation_keeps_deliveries_verifying(hub: Hub, target: TokenAgent) -> None:
    assert hub.submit(TARGET)["status"] == "success"
    old_kid, old_key = hub_key(hub.store)

    # with a grace period: published at once, signing later; deliveries go on as before
    ahead = hub.rotate(immediate=False)
    assert ahead["state"] == "next" and ahead["kid"] in hub.jwks_kids()
    view = hub.submit(TARGET)
    assert view["status"] == "success"
    assert jwt.get_unverified_header(target.tokens(view["task_id"])[0])["kid"] == old_kid

    # at once (a compromised key): the next deliveries carry the new kid, and verify
    fetched = target.counts()["jwks_fetches"]
    now = hub.rotate(immediate=True)
    assert now["state"] == "signing"
    published = set(hub.jwks_kids())
    assert {old_kid, now["kid"]} <= published  # the old key: until its tokens expire
    assert ahead["kid"] not in published  # published ahead, never signed: withdrawn

    def delivered_with_new_key() -> bool:
        view = hub.submit(TARGET)
        assert view["status"] == "success", view  # never refused on the way
        # a token of a kid the agent fetched the keys for moments ago is answered 503
        # ("cannot tell yet"), and the hub's retry gets through
        assert set(target.counts()["refused"].get(view["task_id"], [])) <= {503}
        token = target.tokens(view["task_id"])[-1]
        return bool(jwt.get_unverified_header(token)["kid"] == now["kid"])

    wait_until(delivered_with_new_key, timeout=30, interval=0.5, what="a token of the new key")
    assert target.counts()["jwks_fetches"] > fetched  # it learnt the new key from the hub
    # a token of the old key stays good until the last one it signed has expired
    task_id = new_task()
    claims = claims_for(
        "agent-reach", "anonymous", TARGET, task_id, 1, time.time(), 300, "j-o", **bound(task_id)
    )
    status, _ = target.post(task_id, bearer(sign(claims, old_kid, old_key)))
    assert status == 200
    assert target.runs(task_id) == 1


# -- both ways of serving ------------------------------------------------------------------


def test_the_asgi_app_checks_tokens_as_the_builtin_server_does(hub: Hub) -> None:
    agent_id = f"tk-asgi-{uuid.uuid4().hex[:6]}"
    agent = reach.Agent(
        agent_id,
        addr=f"127.0.0.1:{free_port()}",
        allow_loopback=True,
        heartbeat_interval=3600,
        hub=hub.stack.url,
        api_key="",  # never registers: only served, to be posted to
    )
    ran: list[str] = []

    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, Any]) -> Any:
        ran.append(task_id)
        return payload

    parent = FastAPI()
    parent.mount("/reach", agent.asgi_app())
    with (
        uvicorn_serving(agent.asgi_app(), free_port(), lifespan="off") as alone,
        uvicorn_serving(parent, free_port(), lifespan="off") as mounted,
    ):
        for base in (alone, mounted + "/reach"):
            task_id = new_task()
            raw = encoded({"task_id": task_id, "payload": {"k": 1}, "attempt_seq": 1})
            refused = requests.post(f"{base}/tasks/work.do", data=raw, timeout=10)
            assert (refused.status_code, refused.json()["code"]) == (401, 401)
            assert ran == [] or task_id not in ran
            token = mint(hub.store, audience=agent_id, task_id=task_id, body=raw)
            ok = requests.post(f"{base}/tasks/work.do", data=raw, headers=bearer(token), timeout=10)
            assert (ok.status_code, ok.json()) == (200, {"code": 0, "data": {"k": 1}})
            assert ran.count(task_id) == 1
    agent.hub.close()
