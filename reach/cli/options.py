"""What every command that talks to the hub's API shares: ``--hub``, ``--api-key`` and how
a refusal is printed (one line on stderr, a non-zero exit).

Its own module so sub-apps (``reach approvals``) take the same options as ``reach.cli.commands``
without importing it (which registers them).
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from reach.errors import ConfigError, Forbidden, ReachError, Unauthenticated

__all__ = ["ApiKeyOption", "HubOption", "fail"]

err_console = Console(stderr=True, soft_wrap=True)

HubOption = Annotated[
    str | None, typer.Option("--hub", help="Hub URL (default: $REACH_HUB_URL or 127.0.0.1:8800)")
]
# The help never shows the value: typer would print an envvar's value as the default.
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="REACH_API_KEY",
        show_envvar=False,
        show_default=False,
        help="API key sent to the hub (default: $REACH_API_KEY)",
    ),
]


def fail(exc: ReachError) -> NoReturn:
    """One line on stderr and a non-zero exit (the hub's details name a key by id only)."""
    hint = ""
    if isinstance(exc, Unauthenticated):
        hint = " (pass --api-key or set $REACH_API_KEY)"
    elif isinstance(exc, Forbidden):
        hint = " (this API key's scope does not allow it)"
    err_console.print(f"[red]{type(exc).__name__}:[/red] {escape(str(exc))}{hint}")
    raise typer.Exit(2 if isinstance(exc, ConfigError) else 1)  # 2: bad input, like --payload
