"""A part of a long bench run that raises is recorded and the run goes on."""

from __future__ import annotations

from typing import Any

from bench.cli import _guard


def test_a_failing_part_is_recorded_and_the_next_part_still_runs() -> None:
    result: dict[str, Any] = {"meta": {}}
    logged: list[str] = []
    guard = _guard(result, lambda name, row: logged.append(name))
    ran: list[str] = []
    with guard("fleet"):
        raise OSError("no loopback address left")
    with guard("soak"):
        ran.append("soak")
    assert result["meta"]["failed"] == {"fleet": "OSError: no loopback address left"}
    assert ran == ["soak"] and logged == ["fleet FAILED"]


def test_a_run_without_failures_records_none() -> None:
    result: dict[str, Any] = {"meta": {}}
    with _guard(result, lambda *_: None)("cost"):
        pass
    assert "failed" not in result["meta"]
