"""Celery's logging as the hub's: JSON lines from the worker and beat (``logging.format``).

Celery sets its logging up itself when a worker or beat starts (its own formatters on the
root and ``celery.task`` loggers) unless a receiver of its ``setup_logging`` signal does it
instead: `install` connects one that puts `reach.hub.logs`'s JSON handler on the root
logger, and sends what a task prints there too, as Celery's own set-up would. Prefork
children inherit it. While a task runs, its lines name the hub's task and attempt
(``task_prerun`` / ``task_postrun``; the delivery pipeline adds the agent).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from celery.apps import worker as celery_worker
from celery.utils.log import get_logger

from reach.hub import logs
from reach.hub.settings import Settings

# Celery tasks whose first arguments are a hub task's id (and its attempt)
_TASK_ARGS = {"reach.deliver": ("task_id", "attempt")}


def install(app: Celery, settings: Settings, role: str) -> bool:
    """JSON logs for this process's Celery (when ``logging.format`` is json); whether so."""
    if settings.logging.format != "json":
        return False

    def setup(loglevel: int | None = None, **_: Any) -> None:
        # the role a CLI command set first (``reach flower`` loads the worker's app)
        logs.configure("json", logs.configured_role() or role, loglevel or logging.INFO)
        if app.conf.worker_redirect_stdouts:
            level = app.conf.worker_redirect_stdouts_level
            app.log.redirect_stdouts_to_logger(get_logger("celery.redirected"), loglevel=level)

    # the worker writes its shutdown notices straight to the terminal's stdout: as lines
    # of its logger instead (the one patch, at the worker's entry point)
    celery_worker.safe_say = _say
    signals.setup_logging.connect(setup, weak=False)
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_ended, weak=False)
    return True


def _say(msg: str, f: Any = None) -> None:
    logging.getLogger("celery.apps.worker").info(msg)


def _task_started(task: Any = None, args: Any = None, **_: Any) -> None:
    names = _TASK_ARGS.get(getattr(task, "name", ""))
    if names and args:
        fields = dict(zip(names, args, strict=False))
        logs.bind_task(task_id=str(fields["task_id"]), attempt=fields.get("attempt"))


def _task_ended(**_: Any) -> None:
    logs.clear_task()
