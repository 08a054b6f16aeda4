"""One image runs everything for a trial (issue 39, item 13): ``docker run -p 8800:8800 -v
reach:/var/lib/reach agent-reach up``, without a Docker engine. The command line the
Dockerfile's final stage makes of ``up`` (its ENTRYPOINT, scripts/docker-entrypoint) runs
here with the image's environment, its WORKDIR and HOME pointed at a temporary "volume":
the hub starts with its demo agents, a task sent to one of them succeeds, and after a stop
(``docker stop``: SIGTERM) a second start on the same volume still has the task's record
and the key made in the first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.support.dockerfile import Stage, final_stage
from tests.support.ports import free_block, free_port
from tests.support.waiting import wait_until

VOLUME = "/var/lib/reach"
VENV_BIN = "/opt/venv/bin"
ENTRYPOINT = "/usr/local/bin/reach-entrypoint"
DEMO_AGENTS = 5


def container_env(stage: Stage, volume: Path, port: int) -> dict[str, str]:
    """The image's ENV with its paths mapped onto this machine: the volume onto a temporary
    folder, the image's venv onto the test's. Two changes a test needs: the API binds
    loopback (tests listen nowhere else) on a free port, and since the image's 0.0.0.0
    requires API keys, keys are required here too (the same hub behind another address)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    for name, value in stage.env.items():
        mapped = value.replace(VENV_BIN, str(Path(sys.executable).parent))
        mapped = mapped.replace(VOLUME, str(volume)).replace("$PATH", os.environ["PATH"])
        env[name] = mapped
    assert stage.env["REACH_SERVER__HOST"] == "0.0.0.0"  # what -p 8800:8800 needs
    env.update(
        REACH_SERVER__HOST="127.0.0.1",
        REACH_SERVER__PORT=str(port),
        REACH_SECURITY__REQUIRE_AUTH="true",
    )
    return env


@contextmanager
def container(stage: Stage, volume: Path, env: dict[str, str], *args: str) -> Iterator[Path]:
    """``docker run IMAGE args…``: the stage's command line in its WORKDIR; stopped with
    SIGTERM as ``docker stop`` does, and the exit awaited. Yields the file of its output."""
    argv = stage.argv(*args)
    assert argv[0] == "reach-entrypoint"
    argv[0] = str(stage.copied_to(ENTRYPOINT))
    out = volume / f"run-{len(list(volume.glob('run-*.out')))}.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            argv, env=env, cwd=stage.workdir.replace(VOLUME, str(volume)), stdout=sink, stderr=sink
        )
    try:

        def up() -> bool:
            assert proc.poll() is None, out.read_text(errors="replace")
            return "all demo agents online" in out.read_text(errors="replace")

        wait_until(up, timeout=90, interval=0.25, what="the hub and its demo agents")
        yield out
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            left = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.wait()
            for child in left:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass


def reach_cli(env: dict[str, str], *args: str) -> str:
    """``docker exec CONTAINER reach …``."""
    done = subprocess.run(
        ["reach", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"reach {args}: {done.stdout}\n{done.stderr}"
    return done.stdout


# two starts of the whole hub and its five demo agents: ~40 s alone, more on a busy box
@pytest.mark.timeout(300)
def test_docker_run_up_keeps_its_state_in_the_volume(tmp_path: Path) -> None:
    stage = final_stage()
    assert stage.volumes == [VOLUME]
    assert stage.workdir == VOLUME
    assert stage.env["HOME"] == stage.env["REACH_HOME"] == VOLUME
    assert stage.user.split(":")[0] == "reach"
    volume = tmp_path / "volume"
    volume.mkdir()
    port = free_port()
    env = container_env(stage, volume, port)
    demo_port = str(free_block(DEMO_AGENTS))  # the image's 7101-7105 may be taken here
    cli_env = {**env, "REACH_HUB_URL": f"http://127.0.0.1:{port}"}
    task_id = "image-trial-1"

    with container(stage, volume, env, "up", "--demo-port", demo_port) as said:
        banner = said.read_text()
        assert "loopback agent addresses allowed for this run" in banner
        secret = reach_cli(cli_env, "keys", "create", "--scope", "admin", "--name", "trial")
        cli_env["REACH_API_KEY"] = secret.strip().splitlines()[-1]
        sent = reach_cli(
            cli_env,
            "send",
            "task.process",
            "--agent",
            "doc-analyzer-01",
            "--task-id",
            task_id,
            "--payload",
            '{"doc_id": "a1", "text": "one image runs everything"}',
            "--wait",
            "60",
        )
        answer = json.loads(sent)
        assert answer["status"] == "success", sent
        assert answer["result"]["words"] == 4, sent

    assert (volume / "reach.db").is_file()  # the embedded store, in the volume
    assert (volume / "logs" / "api.log").is_file()

    with container(stage, volume, env, "up", "--demo-port", demo_port):
        shown = reach_cli(cli_env, "tasks", "show", task_id)  # the first run's key still works
        assert task_id in shown and "success" in shown, shown
