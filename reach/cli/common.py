"""What every ``reach`` command shares: the consoles, ``--config`` and the settings it loads,
and the small notices processes print at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from reach.errors import ConfigError

if TYPE_CHECKING:
    from reach.hub.settings import Settings

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="config.yaml to read (seed 000's keys work: probe.interval: 5s, storage.type: "
        "sqlite, storage.path ...); the same as REACH_CONFIG, also for the processes this "
        "command starts",
    ),
]


def use_config(config: Path | None) -> None:
    """``--config PATH``: as ``REACH_CONFIG``, so the worker's app, beat's schedule and the
    processes ``reach up`` starts read the same file."""
    if config is not None:
        os.environ["REACH_CONFIG"] = str(config.expanduser().resolve())


def load_settings_or_exit() -> Settings:
    from reach.hub.settings import load_settings  # pydantic-settings: only where needed

    try:
        settings = load_settings()
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}")
        raise typer.Exit(2) from None
    # Before prometheus_client is imported anywhere: every hub process writes its
    # counters into one directory, and /metrics merges them.
    metrics_dir = settings.storage.home_path / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    return settings


def announce_semantic(ctx: Any) -> None:
    """Say at start-up whether semantic matching is on (``router.semantic: on`` without
    the extra stops here), and let its model-loading lines reach the API's log."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("reach.hub.fleet.matching", "reach.hub.fleet.embeddings"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        semantic = ctx.matcher.availability
    except ConfigError as exc:  # escaped: "[semantic]" is no markup
        err_console.print(f"[red]configuration error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    log = logging.getLogger("reach.hub.fleet.matching")
    if semantic.on:
        log.info("semantic matching is on: %s", semantic.reason)
    else:
        log.info("semantic matching is off: %s", semantic.reason)


def warn_upkeep(problem: str | None) -> None:
    """A database that will slow the hub down as it runs: said at start, not refused
    (an operator may vacuum on a schedule of their own)."""
    if problem:
        err_console.print(f"[yellow]warning:[/yellow] {problem}", soft_wrap=True)


def redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
