"""The image's entry point and final stage, without a Docker engine: which command
``docker run IMAGE ARGS`` runs, and that the demo agents land where ``reach up`` looks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from reach.cli.commands import app
from reach.cli.supervisor import demo_needs_loopback, examples_candidates
from reach.hub.settings import load_settings
from tests.support.dockerfile import final_stage

ENTRYPOINT = "/usr/local/bin/reach-entrypoint"


def run_entrypoint(tmp_path: Path, *args: str) -> str:
    """The entry script with a stand-in ``reach`` first on PATH that prints its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "reach"
    fake.write_text('#!/bin/sh\necho "reach $*"\n')
    fake.chmod(0o755)
    script = final_stage().copied_to(ENTRYPOINT)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        [str(script), *args], env=env, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (("up",), "reach up"),  # docker run agent-reach up
        (("up", "--demo-port", "7201"), "reach up --demo-port 7201"),
        (("flower", "--port", "5555"), "reach flower --port 5555"),  # not Flower's own CLI
        (("--help",), "reach --help"),
        (("reach", "api", "--port", "8800"), "reach api --port 8800"),  # compose's commands
        (("sh", "-c", "echo as given"), "as given"),  # security-init's script
        (("echo", "up"), "up"),
    ],
)
def test_entrypoint_puts_reach_before_its_commands_only(
    tmp_path: Path, args: tuple[str, ...], runs: str
) -> None:
    assert run_entrypoint(tmp_path, *args) == runs


def test_default_command_runs_the_api(tmp_path: Path) -> None:
    stage = final_stage()
    assert run_entrypoint(tmp_path, *stage.cmd) == "reach api --port 8800"


def test_entrypoint_knows_every_reach_command(tmp_path: Path) -> None:
    """A command added to the CLI must reach `docker run IMAGE <command>` too."""
    commands = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert commands
    for name in commands:
        assert run_entrypoint(tmp_path, name) == f"reach {name}", name


def test_the_image_copies_the_demo_agents_where_reach_up_looks() -> None:
    stage = final_stage()
    (destination,) = [dest for sources, dest, _ in stage.copies if sources == ["examples/agents/"]]
    assert (stage.copied_to(destination) / "doc_analyzer.py").is_file()
    here = Path(destination.rstrip("/").replace("/opt/venv", sys.prefix, 1))
    assert here in examples_candidates()


@pytest.mark.parametrize(
    ("host", "require_auth", "allow_loopback", "opens"),
    [
        ("127.0.0.1", None, False, False),  # the local demo hub takes loopback agents
        ("0.0.0.0", None, False, True),  # the image: beyond loopback, keys required
        ("127.0.0.1", True, False, True),  # keys required on loopback
        ("0.0.0.0", False, False, True),  # open beyond loopback is no local demo either
        ("0.0.0.0", None, True, False),  # the operator allowed them already
    ],
)
def test_reach_up_allows_loopback_agents_only_where_the_demo_needs_it(
    host: str, require_auth: bool | None, allow_loopback: bool, opens: bool
) -> None:
    env = {"REACH_SERVER__HOST": host}
    if require_auth is not None:
        env["REACH_SECURITY__REQUIRE_AUTH"] = str(require_auth).lower()
    env["REACH_SECURITY__ALLOW_LOOPBACK_AGENTS"] = str(allow_loopback).lower()
    assert demo_needs_loopback(load_settings(environ=env, config_path=None)) is opens
