"""The SDK's credentials: which key a client sends, the header, and that no repr, log
line or error detail shows it. No sockets: clients are built, never called."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from typer.testing import CliRunner

import reach
from reach.cli.commands import app
from reach.errors import ConfigError, Forbidden, ReachError, Unauthenticated, error_for_problem
from reach.sdk import trace
from reach.sdk.aio_client import AsyncHubClient
from reach.sdk.hub_client import (
    HubClient,
    _refusal,
    _scrubbed,
    auth_headers,
    default_api_key,
    redact,
    resolve_api_key,
)

KEY = "rk_0123456789abcdef_" + "S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t"
ENV_KEY = "rk_fedcba9876543210_" + "EnvEnvEnvEnvEnvEnvEnvEnvEnvEnvEnvEnvEnvEn"
AGENT_KEY = "rk_aaaaaaaaaaaaaaaa_" + "AgentAgentAgentAgentAgentAgentAgentAgent"


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_API_KEY", raising=False)


@pytest.mark.parametrize(
    ("given", "env", "in_handler", "sent"),
    [
        (None, None, None, None),  # nothing anywhere: no header
        (None, ENV_KEY, None, ENV_KEY),  # the environment
        (KEY, ENV_KEY, None, KEY),  # an explicit key wins
        ("", ENV_KEY, None, None),  # "" means none, whatever the environment says
        (None, ENV_KEY, AGENT_KEY, AGENT_KEY),  # inside a handler: its agent's key
        (KEY, ENV_KEY, AGENT_KEY, KEY),  # ... unless one is passed
        (None, None, AGENT_KEY, AGENT_KEY),
        (f"  {KEY}\n", None, None, KEY),  # a newline read from a file is dropped
        ("   ", ENV_KEY, None, None),
    ],
)
def test_which_key_is_sent(
    monkeypatch: pytest.MonkeyPatch,
    given: str | None,
    env: str | None,
    in_handler: str | None,
    sent: str | None,
) -> None:
    if env is not None:
        monkeypatch.setenv("REACH_API_KEY", env)
    if in_handler is None:
        assert resolve_api_key(given) == sent
        return
    with trace.handling("t-1", None, "planner", "http://hub:8800", in_handler):
        assert resolve_api_key(given) == sent
    assert trace.api_key_of_current() is None  # the handler's key does not outlive it


def test_header_carries_the_key_as_bearer() -> None:
    assert auth_headers(KEY) == {"Authorization": f"Bearer {KEY}"}
    assert auth_headers(None) == {}


def test_the_key_is_not_part_of_the_trace_sent_on() -> None:
    with trace.handling("t-1", None, "planner", "http://hub:8800", AGENT_KEY):
        assert default_api_key() == AGENT_KEY
        assert AGENT_KEY not in repr(trace.current())
        assert AGENT_KEY not in repr(trace.child_of(trace.current()))


@pytest.mark.parametrize(
    "bad",
    [
        "rk_0123456789abcdef_has space",
        "rk_0123456789abcdef_new\nline",
        "rk_0123456789abcdef_tab\there",
        "rk_0123456789abcdef_ünïcode",
        "rk_0123456789abcdef_\x00nul",
    ],
)
def test_a_key_requests_would_refuse_is_refused_without_echoing_it(bad: str) -> None:
    # requests' own InvalidHeader error would print the whole header value
    with pytest.raises(ConfigError) as caught:
        HubClient("http://hub:8800", api_key=bad)
    assert bad not in str(caught.value)
    assert "rk_0123456789abcdef_" not in str(caught.value)


def test_a_bad_key_in_the_environment_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REACH_API_KEY", "rk_0123456789abcdef_two words")
    with pytest.raises(ConfigError, match=r"\$REACH_API_KEY"):
        HubClient("http://hub:8800")


def test_client_repr_says_whether_a_key_is_set_not_which() -> None:
    client = HubClient("http://hub:8800", api_key=KEY)
    try:
        assert KEY not in repr(client) and "S3cr3t" not in repr(client)
        assert "api_key=set" in repr(client)
        assert client.authenticated
        assert "api_key=none" in repr(HubClient("http://hub:8800", api_key="", shared=True))
    finally:
        client.close()


def test_async_client_resolves_and_hides_the_key_as_the_sync_one() -> None:
    client = AsyncHubClient("http://hub:8800/", api_key=KEY)
    assert client.base_url == "http://hub:8800" and client.authenticated
    assert KEY not in repr(client) and "api_key=set" in repr(client)
    assert not AsyncHubClient("http://hub:8800", api_key="").authenticated
    with pytest.raises(ConfigError) as caught:
        AsyncHubClient("http://hub:8800", api_key="rk_0123456789abcdef_has space")
    assert "has space" not in str(caught.value)


def test_an_asyncio_task_started_in_a_handler_takes_its_agents_key_and_hub() -> None:
    """Context variables are copied into each asyncio task: a reach sent from a task the
    handler started authenticates as the handler's agent, on its hub."""

    async def build() -> AsyncHubClient:
        return AsyncHubClient()

    async def client_of_a_new_task() -> AsyncHubClient:
        return await asyncio.create_task(build())  # the task runs in a copy of this context

    async def main() -> tuple[AsyncHubClient, AsyncHubClient]:
        with trace.handling("t-1", None, "planner", "http://agents-hub:8800", AGENT_KEY):
            inside = await client_of_a_new_task()
        return inside, await client_of_a_new_task()

    inside, outside = asyncio.run(main())
    assert inside.base_url == "http://agents-hub:8800" and inside._api_key == AGENT_KEY
    assert outside.base_url != "http://agents-hub:8800" and not outside.authenticated


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"key {KEY} refused", "key rk_0123456789abcdef_… refused"),
        (f"Bearer {KEY}", "Bearer rk_0123456789abcdef_…"),
        ("nothing secret", "nothing secret"),
    ],
)
def test_redact_keeps_only_the_key_id(text: str, shown: str) -> None:
    assert redact(text, KEY) == shown


def test_redact_of_a_key_of_another_shape_hides_all_of_it() -> None:
    assert redact("x token-abc-def y", "token-abc-def") == "x <api key> y"


def test_a_problem_that_echoes_the_key_is_scrubbed() -> None:
    problem: dict[str, Any] = {
        "type": "urn:agent-reach:problem:unauthenticated",
        "detail": f"invalid API key {KEY}",
        "errors": [{"msg": f"got {KEY}"}],
        "n": 3,
    }
    error = error_for_problem(_scrubbed(problem, KEY), 401)
    assert isinstance(error, Unauthenticated)
    assert KEY not in str(error) and KEY not in repr(error.extra)
    assert "rk_0123456789abcdef_…" in str(error)


@pytest.mark.parametrize(
    ("problem", "status", "kind"),
    [
        ({"type": "urn:agent-reach:problem:unauthenticated", "detail": "x"}, 401, Unauthenticated),
        ({"type": "urn:agent-reach:problem:forbidden", "detail": "x"}, 403, Forbidden),
        # a proxy's 401/403 without a problem document is a security error all the same
        ({"detail": "<html>401 Authorization Required</html>"}, 401, Unauthenticated),
        ({"detail": "<html>403 Forbidden</html>"}, 403, Forbidden),
        ({"detail": "teapot"}, 418, ReachError),
    ],
)
def test_refusals_become_typed_security_errors(
    problem: dict[str, Any], status: int, kind: type[ReachError]
) -> None:
    error = _refusal(error_for_problem(problem, status), status)
    assert type(error) is kind
    if kind is not ReachError:
        assert isinstance(error, reach.SecurityError)


def test_agent_takes_its_key_from_the_environment_and_never_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REACH_API_KEY", ENV_KEY)
    agent = reach.Agent("a-1", addr="10.0.0.5:7001", hub="http://hub:8800")
    assert agent.hub.authenticated
    assert ENV_KEY not in repr(agent.hub)
    explicit = reach.Agent("a-2", addr="10.0.0.5:7002", hub="http://hub:8800", api_key=KEY)
    assert explicit._api_key == KEY
    bare = reach.Agent("a-3", addr="10.0.0.5:7003", hub="http://hub:8800", api_key="")
    assert not bare.hub.authenticated


def test_an_agent_inside_another_handler_does_not_borrow_its_key() -> None:
    with trace.handling("t-1", None, "planner", "http://hub:8800", AGENT_KEY):
        inner = reach.Agent("a-4", addr="10.0.0.5:7004", hub="http://hub:8800")
    assert not inner.hub.authenticated


def test_a_handler_sees_its_agents_key_as_the_default() -> None:
    agent = reach.Agent("a-5", addr="10.0.0.5:7005", hub="http://hub:8800", api_key=AGENT_KEY)
    seen: list[str | None] = []

    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(default_api_key())
        return {}

    status, _ = agent.invoke("work.do", {"task_id": "t-9", "payload": {}, "attempt_seq": 1})
    assert status == 200 and seen == [AGENT_KEY]
    assert default_api_key() is None


# -- the command line --------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize(
    "command", [["send", "--help"], ["tasks", "show", "--help"], ["dlq", "list", "--help"]]
)
def test_help_names_the_variable_never_its_value(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setenv("REACH_API_KEY", KEY)
    result = runner.invoke(app, command, env={"REACH_API_KEY": KEY, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--api-key" in result.output and "REACH_API_KEY" in result.output
    assert "S3cr3t" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "agent"], "--agent-id"),
        (["--scope", "agent", "--agent-id", "  "], "--agent-id"),
        (["--scope", "caller", "--agent-id", "a-1"], "only for --scope agent"),
        (["--scope", "admin", "--expires-in", "0"], "positive"),
        (["--scope", "viewer", "--expires-in", "-3"], "positive"),
        (["--scope", "root"], "root"),
    ],
)
def test_keys_create_refuses_bad_input_with_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["keys", "create", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize("key_id", ["short", "UPPERCASE0123456", "has-dash-0123456", ""])
def test_keys_revoke_refuses_what_is_not_a_key_id(key_id: str) -> None:
    result = runner.invoke(app, ["keys", "revoke", key_id])
    assert result.exit_code == 2, result.output
    assert "not a key id" in result.output
