"""``reach bench`` is ``python -m bench`` under the project's CLI."""

from __future__ import annotations

from typer.testing import CliRunner

from reach.cli.commands import app


def test_reach_bench_passes_its_options_to_the_harness() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    assert "--quick" in result.output and "--smoke" in result.output


def test_reach_bench_refuses_an_unknown_option() -> None:
    result = CliRunner().invoke(app, ["bench", "--fastest"])
    assert result.exit_code == 2
