"""Celery application factory: one place that turns Settings into Celery configuration.

Delivery safety lives here: late acks, requeue when a worker dies mid-task, prefetch of
one, and a Redis visibility timeout that is long against every countdown we schedule.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from reach.hub.settings import Settings

TASK_MODULES = [
    "tasks.maintenance",
    "tasks.probing",
    "tasks.delivery",
    "tasks.outbox",
    "tasks.dags",
]
QUEUES = ("reach", "reach.probe")
EMBEDDED_TRANSPORT = "reach.worker.embedded_broker:Transport"
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
        # Task events cost a Redis publish per task state on the hot path; Flower turns
        # them on in the workers it watches (its enable_events), so they stay off here.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "timezone": "UTC",
        "enable_utc": True,
    }
    if broker.startswith("sqla+"):
        config["broker_transport"] = EMBEDDED_TRANSPORT
        config["broker_url"] = broker.removeprefix("sqla+")
    if broker.startswith(("redis://", "rediss://")):
        config["broker_transport_options"] = {"visibility_timeout": 3600}
    if config["result_backend"].startswith("db+"):
        config["database_engine_options"] = {"connect_args": {"timeout": 30}}
    return config


def create_celery(settings: Settings) -> Celery:
    from beat_schedule import beat_schedule

    app = Celery("reach", include=TASK_MODULES)
    app.conf.update(celery_config(settings))
    app.conf.beat_schedule = beat_schedule(settings)
    return app
