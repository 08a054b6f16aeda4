"""Where Flower can work: it needs a broker with remote control and task events.

Flower learns about workers by broadcasting to them (``inspect``, ``enable_events``) and
about tasks from the events the workers then send. kombu's SQLAlchemy transport, the
embedded default, has no fan-out exchange: neither reaches anybody, and Flower would show
an empty page. Redis and RabbitMQ have both.
"""

from __future__ import annotations

FLOWER_BROKERS = (
    "redis://",
    "rediss://",
    "redis+socket://",
    "sentinel://",
    "amqp://",
    "amqps://",
    "pyamqp://",
)
REDIS_EXAMPLE = "REACH_BROKER_URL=redis://127.0.0.1:6379/0"
AMQP_EXAMPLE = "REACH_BROKER_URL=amqp://guest:guest@127.0.0.1:5672//"


def flower_supported(broker_url: str) -> bool:
    """Whether Flower can see workers and tasks on this broker (Redis or RabbitMQ)."""
    return broker_url.startswith(FLOWER_BROKERS)


def flower_refusal(broker_url: str) -> str | None:
    """Why ``reach flower`` would show nothing on this broker, and what to do; None if it works."""
    if flower_supported(broker_url):
        return None
    if broker_url.startswith("sqla+"):
        why = (
            "the embedded broker (kombu's SQLAlchemy transport) gives workers no remote "
            "control and no task events, so Flower would show an empty page"
        )
    else:
        why = f"{broker_url.split(':', 1)[0]} is not a broker Flower works with here"
    return (
        f"Flower needs Redis or RabbitMQ: {why}. Run the hub and Flower with "
        f"{REDIS_EXAMPLE} (or {AMQP_EXAMPLE}); `reach up`, `reach api`, `reach worker` and "
        "`reach beat` read the same variable."
    )


__all__ = ["flower_refusal", "flower_supported"]
