"""Celery's worker and beat commands run without its umbrella CLI (``reach.worker.launch``)."""

from __future__ import annotations

import pytest
from celery import Celery

from reach.worker import launch


def test_an_unknown_command_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Celery command 'flower'"):
        launch.run(Celery("t"), "flower", [])


@pytest.mark.parametrize("command", launch.COMMANDS)
def test_each_command_takes_celerys_own_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch.run(Celery("t"), command, ["--help"]) == 0
    out = capsys.readouterr().out
    assert f"celery {command}" in out and "--loglevel" in out
