"""What every ``reach`` command shares: the consoles, ``--config`` and the settings it loads,
and the small notices processes print at start."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

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


_json_logs = False  # this process logs JSON lines (`start_logging`)


def start_logging(settings: Settings, role: str) -> None:
    """JSON lines from here on when ``logging.format`` is json (`reach.hub.logs`); the
    notices below then become log lines too, so every line of the process parses."""
    global _json_logs
    from reach.hub import logs

    _json_logs = logs.configure(settings.logging.format, role)


def json_logs() -> bool:
    return _json_logs


def notice(text: str, *, level: int = logging.WARNING) -> None:
    """A start-up notice: rich text on stderr, or a log line of ``reach.cli`` (its
    markup dropped) when the process logs JSON."""
    if _json_logs:
        logging.getLogger("reach.cli").log(level, Text.from_markup(text).plain)
    else:
        err_console.print(text)


def announce_semantic(ctx: Any) -> None:
    """Say at start-up whether semantic matching is on (``router.semantic: on`` without
    the extra stops here), and let its model-loading lines reach the API's log."""
    for name in ("reach.hub.fleet.matching", "reach.hub.fleet.embeddings"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not _json_logs:  # JSON: the root logger's handler writes them
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
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
        notice(f"[yellow]warning:[/yellow] {escape(problem)}")


def redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
