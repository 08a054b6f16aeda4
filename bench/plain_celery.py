"""Baseline (b): a plain Celery task that posts to the agent with requests.

No registry, no outbox, no bookkeeping: what the hub is measured against. Run as
``celery -A bench.plain_celery worker`` with the broker and result backend in
``BENCH_CELERY_URL`` (by default the bench's Redis, database 11:
``bench.processes.CELERY_URL``); the result travels back through the Redis result backend.
"""

from __future__ import annotations

import threading
from typing import Any

import requests
from celery import Celery

from bench.processes import CELERY_URL

URL = CELERY_URL
app = Celery("bench_plain", broker=URL, backend=URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
_local = threading.local()


@app.task(name="bench.post")  # type: ignore[untyped-decorator]
def post(url: str, body: dict[str, Any]) -> Any:
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    answer = session.post(url, json=body, timeout=(2, 30))
    answer.raise_for_status()
    return answer.json()
