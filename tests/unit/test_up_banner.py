"""What `reach up` prints before it goes quiet, and where `reach flower` refuses to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from reach.cli.flower import flower_refusal, flower_supported
from reach.cli.supervisor import banner_lines
from reach.core.security.auth import new_secret
from reach.hub.settings import load_settings

HUB = "http://127.0.0.1:8800"


@pytest.mark.parametrize(
    ("broker", "works"),
    [
        ("sqla+sqlite:///.reach/broker.db", False),  # the embedded default
        ("sqla+postgresql://db/reach", False),
        ("memory://", False),
        ("redis://127.0.0.1:6379/0", True),
        ("rediss://redis:6380/0", True),
        ("sentinel://s1:26379", True),
        ("amqp://guest:guest@rabbit:5672//", True),
        ("pyamqp://rabbit//", True),
    ],
)
def test_flower_works_on_redis_and_rabbitmq_only(broker: str, works: bool) -> None:
    assert flower_supported(broker) is works
    refusal = flower_refusal(broker)
    assert (refusal is None) is works
    if refusal is not None:
        assert refusal.startswith("Flower needs Redis or RabbitMQ")
        assert "REACH_BROKER_URL=redis://" in refusal and "amqp://" in refusal
        assert "guest:guest@rabbit" not in refusal  # the configured URL is not echoed


def test_embedded_banner_names_hub_dashboard_logs_and_why_not_flower() -> None:
    settings = load_settings(environ={"REACH_HOME": "/srv/demo"})
    lines = banner_lines(settings, HUB, Path("/srv/demo/logs"))
    text = "\n".join(lines)
    assert f"hub        [bold]{HUB}[/bold]" in text
    assert f"dashboard  {HUB}/ui" in text
    assert "flower     needs Redis or RabbitMQ" in text
    assert "auth is off: the API listens on loopback only" in text  # kept from before
    assert "logs       /srv/demo/logs/" in text and "--verbose" in text
    assert len(lines) <= 8


def test_redis_banner_gives_the_flower_command() -> None:
    settings = load_settings(
        environ={"REACH_HOME": "/srv/demo", "REACH_BROKER_URL": "redis://127.0.0.1:6379/0"}
    )
    text = "\n".join(banner_lines(settings, HUB, None))
    assert "flower     reach flower --port 5555" in text
    assert "logs       streamed below (--verbose)" in text


def test_auth_on_banner_says_how_to_get_a_key_and_never_shows_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"REACH_HOME": "/srv/demo", "REACH_SECURITY__REQUIRE_AUTH": "true"}
    monkeypatch.delenv("REACH_API_KEY", raising=False)
    text = "\n".join(banner_lines(load_settings(environ=env), HUB, None))
    assert "auth is off" not in text
    assert "reach keys create --scope admin" in text and "REACH_API_KEY" in text

    secret = new_secret("k0demo000001")
    monkeypatch.setenv("REACH_API_KEY", secret)
    text = "\n".join(banner_lines(load_settings(environ=env), HUB, None))
    assert "key k0demo000001" in text  # which key, by id
    assert secret not in text and secret.rsplit("_", 1)[-1] not in text
