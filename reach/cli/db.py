"""``reach db``: the database schema."""

from __future__ import annotations

from typing import Annotated

import typer

from reach.cli.common import console, load_settings_or_exit, redact, warn_upkeep

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Apply schema migrations (SQLite or PostgreSQL)."""
    from reach.hub.storage import upgrade_database

    settings = load_settings_or_exit()
    url = settings.storage.resolved_database_url
    upgrade_database(url, revision)
    console.print(f"database at {redact(url)} upgraded to {revision}")
    from reach.hub.storage.engine import autovacuum_problem

    warn_upkeep(autovacuum_problem(url))
