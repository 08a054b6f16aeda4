"""Celery's own ``worker`` and ``beat`` commands, run on the hub's app without Celery's
umbrella command line.

``app.worker_main`` and ``app.start`` go through ``celery.bin.celery``, which loads every
installed plugin of the ``celery`` command as it is imported: Flower with tornado, the
REPL's prompt_toolkit, pygments; about 15 MB in every hub process it starts, and every
prefork child inherits it. The commands themselves (``celery.bin.worker``,
``celery.bin.beat``) take the same options and build the same ``app.Worker`` and
``app.Beat``; what the umbrella adds (loading an app by name, global options) the hub does
not use.
"""

from __future__ import annotations

from typing import Any

COMMANDS = ("worker", "beat")


def run(app: Any, command: str, args: list[str], *, quiet: bool = False) -> int:
    """Run Celery's ``command`` (worker or beat) on ``app`` with ``args`` (its own options,
    as after ``celery worker``); its exit code."""
    from celery.bin.base import CLIContext

    if command == "worker":
        from celery.bin.worker import worker as cli
    elif command == "beat":
        from celery.bin.beat import beat as cli
    else:
        raise ValueError(f"unknown Celery command {command!r}: one of {', '.join(COMMANDS)}")
    context = CLIContext(app=app, no_color=False, workdir=None, quiet=quiet)
    code = cli.main(args=args, obj=context, prog_name=f"celery {command}", standalone_mode=False)
    return code if isinstance(code, int) else 0
