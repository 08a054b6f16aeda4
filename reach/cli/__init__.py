"""The ``reach`` command line (hub install): commands, rendering and the ``reach up`` supervisor.

The console script is installed with the SDK too, so :func:`main` checks that the hub's
packages are present before importing any of them: an SDK-only install gets one line saying
what to install instead of a traceback.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec

# Top-level modules the command line and the processes it starts import.
HUB_MODULES = ("typer", "rich", "celery", "sqlalchemy", "alembic", "fastapi", "uvicorn", "yaml")
HUB_INSTALL_HINT = "pip install 'agent-reach[hub]'"


def missing_hub_modules() -> list[str]:
    """The hub's top-level modules this environment lacks (found without importing them)."""
    return [name for name in HUB_MODULES if find_spec(name) is None]


def main() -> None:
    """Entry point of the ``reach`` console script and ``python -m reach``."""
    missing = missing_hub_modules()
    if missing:
        sys.stderr.write(
            f"reach: the command line is part of the hub, which is not installed here "
            f"(missing: {', '.join(missing)}); install it with: {HUB_INSTALL_HINT}\n"
        )
        raise SystemExit(2)
    from reach.cli.commands import main as run

    run()


__all__ = ["HUB_INSTALL_HINT", "main", "missing_hub_modules"]
