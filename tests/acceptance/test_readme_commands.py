"""The README's two commands, as a newcomer runs them: from a fresh clone, in a new venv."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import requests

from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.waiting import wait_until


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_opens_with_two_commands_and_ci_runs_the_second() -> None:
    run, test = readme_commands()
    assert "\n" not in run and "reach up" in run and "pip install" in run
    assert test == "bash scripts/test"
    ci = (REPO / ".ci" / "run").read_text()
    assert "exec bash scripts/test" in ci


def test_first_command_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=60)
    # the tests run the working tree: bring uncommitted edits along so they are what is tested
    diff = subprocess.run(["git", "diff", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "apply", "--allow-empty"], cwd=clone, input=diff, check=True)
    new = subprocess.run(  # and new files git does not know yet (a diff leaves them out)
        ["git", "ls-files", "-z", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, new.decode().split("\0")):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    run, _ = readme_commands()
    port = free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "REACH_SERVER__PORT": str(port),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen(
        ["bash", "-c", run],
        cwd=clone,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    hub = f"http://127.0.0.1:{port}"
    try:

        def demo_online() -> bool:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "up.log").read_text())
            try:
                agents = requests.get(f"{hub}/api/v1/agents", timeout=2).json()["agents"]
            except (requests.RequestException, ValueError):
                return False
            return {a["agent_id"] for a in agents if a["status"] == "online"} >= {
                "doc-analyzer-01",
                "summarizer-01",
            }

        wait_until(demo_online, timeout=400, interval=1, what="reach up from a fresh clone")
        assert (clone / ".reach" / "reach.db").exists()  # the embedded default store
    finally:
        import os

        try:  # the group is gone if `reach up` already exited (the failure above says why)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=30)
        except ProcessLookupError:
            proc.wait()
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            log.close()
