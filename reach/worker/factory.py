"""Celery application factory: one place that turns Settings into Celery configuration.

Delivery safety lives here: late acks, requeue when a worker dies mid-task, prefetch of
one, a Redis visibility timeout that is long against every countdown we schedule,
publisher confirms on AMQP, and a worker that reconnects to a returning broker at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery

from reach.core.flow.priority import WORKER_QUEUES
from reach.hub.settings import Settings
from reach.worker import broker_schemes
from reach.worker.beat_lock import CONFIG_KEY, BeatLockConfig
from reach.worker.schedule import beat_schedule

# The repository's tasks/, installed as reach.tasks (pyproject.toml: package-dir). A task's
# name is its explicit ``name=`` (``reach.deliver`` ...), never its module's: messages an
# older hub queued still route.
TASK_MODULES = [
    "reach.tasks.maintenance",
    "reach.tasks.probing",
    "reach.tasks.delivery",
    "reach.tasks.outbox",
    "reach.tasks.dags",
    "reach.tasks.webhooks",
    "reach.tasks.callbacks",
    "reach.tasks.a2a",
    "reach.tasks.mcp",
]
QUEUES = WORKER_QUEUES  # probe, online, background: the order workers prefer them in
BEAT_SCHEDULER = "reach.worker.beat_lock:LeasedScheduler"  # one active beat (a lease)
EMBEDDED_TRANSPORT = "reach.worker.embedded_broker:Transport"
WORKER_CONSUMER = "reach.worker.consumer:Consumer"
# Chord state (the header counter on Redis) lives as long as results do: a DAG run that
# could outlive it would never run its next level, so runs are checked against it.
RESULT_EXPIRES_S = 24 * 3600


def celery_config(settings: Settings) -> dict[str, Any]:
    broker = settings.storage.resolved_broker_url
    config: dict[str, Any] = {
        "broker_url": broker,
        "result_backend": settings.storage.resolved_result_backend,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_disable_rate_limits": True,
        "task_default_queue": "reach",
        "task_routes": {"reach.probe_sweep": {"queue": "reach.probe"}},
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": RESULT_EXPIRES_S,
        "result_extended": True,
        "broker_connection_retry_on_startup": True,
        # a worker waits out any broker outage, retrying each second (reach.worker.consumer)
        "broker_connection_max_retries": None,
        "worker_consumer": WORKER_CONSUMER,
        # a delivery under way when the broker drops goes on and records its outcome in the
        # hub database (the truth); only its ack is lost, and a redelivered copy finds the
        # task claimed or ended. Celery 6 would cancel it by default: pinned here.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Task events cost a Redis publish per task state on the hot path; Flower turns
        # them on in the workers it watches (its enable_events), so they stay off here.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "timezone": "UTC",
        "enable_utc": True,
        "beat_scheduler": BEAT_SCHEDULER,
        CONFIG_KEY: BeatLockConfig.from_settings(settings),
    }
    if broker.startswith("sqla+"):
        config["broker_transport"] = EMBEDDED_TRANSPORT
        config["broker_url"] = broker.removeprefix("sqla+")
    if broker.startswith(("redis://", "rediss://")):
        # "priority": every BRPOP lists the queues in the order consumed (online first),
        # instead of rotating the last-served queue to the back
        config["broker_transport_options"] = {
            "visibility_timeout": 3600,
            "queue_order_strategy": "priority",
        }
    if broker.startswith(("amqp://", "amqps://", "pyamqp://")):
        # publisher confirms: a publish the broker did not take (it died with the message
        # in a socket buffer, or refused it) raises, so the outbox row goes back to the
        # relay instead of counting as published and waiting for the overdue net
        config["broker_transport_options"] = {"confirm_publish": True}
    if config["result_backend"].startswith("db+"):
        config["database_engine_options"] = {"connect_args": {"timeout": 30}}
    return config


def _make_sqlite_parent(url: str) -> None:
    """SQLite opens a missing file but not a missing folder: the embedded broker and the
    default result backend live under ``storage.home``, which a fresh checkout (or a worker
    on RabbitMQ with no result backend set) does not have yet."""
    for prefix in ("sqla+sqlite:///", "db+sqlite:///"):
        if url.startswith(prefix):
            Path(url.removeprefix(prefix)).parent.mkdir(parents=True, exist_ok=True)


def create_celery(settings: Settings, task_modules: Sequence[str] = TASK_MODULES) -> Celery:
    """The hub's Celery app. Beat passes no task modules: it sends the schedule's tasks by
    name, and importing them would load the whole hub into it (about 20 MB)."""
    config = celery_config(settings)
    broker_schemes.install()  # redis:// and rediss:// survive a Redis restart
    for url in (settings.storage.resolved_broker_url, config["result_backend"]):
        _make_sqlite_parent(url)
    app = Celery("reach", include=list(task_modules))
    app.conf.update(config)
    app.conf.beat_schedule = beat_schedule(settings)
    return app
