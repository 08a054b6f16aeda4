"""``reach up``'s shutdown of real child processes: each stage gets its grace after SIGTERM,
then SIGKILL, and the children that needed it are named (a demo agent killed so never
deregistered; the terminal says which)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from reach.cli.supervisor import Child, StopRequest, _spawn, _terminate
from tests.support.waiting import wait_until

OBEDIENT = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _start(tmp_path: Path, name: str, code: str, stage: int) -> Child:
    child = _spawn(name, [sys.executable, "-c", code], dict(os.environ), stage, tmp_path)
    assert child.log is not None
    wait_until(lambda: "ready" in child.log.read_text(), timeout=20, what=f"{name} ready")  # type: ignore[union-attr]
    return child


def test_a_child_that_ignores_sigterm_is_killed_after_its_grace_and_named(tmp_path: Path) -> None:
    children = [
        _start(tmp_path, "api", OBEDIENT, 0),
        _start(tmp_path, "stubborn-agent", STUBBORN, 2),
        _start(tmp_path, "agent", OBEDIENT, 2),
    ]
    overdue = _terminate(children, StopRequest(), grace=0.5)
    assert overdue == ["stubborn-agent"]
    codes = {c.name: c.proc.returncode for c in children}
    assert codes == {
        "api": -signal.SIGTERM,
        "stubborn-agent": -signal.SIGKILL,
        "agent": -signal.SIGTERM,
    }


@pytest.mark.parametrize("hurry", [False, True])
def test_children_that_stop_in_time_or_a_hurried_stop_name_nobody(
    tmp_path: Path, hurry: bool
) -> None:
    code = STUBBORN if hurry else OBEDIENT
    children = [_start(tmp_path, "agent", code, 2), _start(tmp_path, "worker", code, 1)]
    # a second Ctrl-C: the user asked for the kill, nobody overstayed
    assert _terminate(children, StopRequest(signum=signal.SIGINT, hurry=hurry), grace=30) == []
    assert all(c.proc.returncode is not None for c in children)
