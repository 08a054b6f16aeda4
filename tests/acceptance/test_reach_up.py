"""`reach up` as a newcomer meets it: a short banner and the demo agents coming online, the
processes' logs under REACH_HOME/logs/, every child gone after SIGINT, SIGTERM, SIGHUP
(also mid-shutdown) or even SIGKILL of the supervisor, and a busy port refused up front."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from sqlalchemy import select

from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import ApiKeyRow, InstanceRow
from tests.support.paths import REPO
from tests.support.ports import free_block, free_port
from tests.support.stacks import hub_env
from tests.support.waiting import wait_until

DEMO = {"doc-analyzer-01", "summarizer-01", "sales-agent-01", "knowledge-agent-01", "chat-agent-01"}
# what Celery and uvicorn print: "[2026-12-01 20:20:07,174: INFO/MainProcess] …",
# "INFO:     Uvicorn running on …", the worker's "celery@host v5.7.0" banner
NOISE = re.compile(r"INFO/|WARNING/|INFO:|celery@|Uvicorn|\[tasks\]|beat: Starting")


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    home: Path
    port: int
    stdout: Path

    def said(self) -> str:
        return self.stdout.read_text(errors="replace")

    def children(self) -> list[psutil.Process]:
        return list(psutil.Process(self.proc.pid).children(recursive=True))


@contextmanager
def reach_up(home: Path, *args: str, demo_port: int | None = None, **settings: str) -> Iterator[Up]:
    """`reach up` on a private REACH_HOME (the embedded default there) and a free port;
    its stdout and stderr kept apart. Killed with its children if a test leaves it running."""
    env = hub_env("", home, **settings)
    env.pop("REACH_DATABASE_URL")
    port = free_port()
    argv = [sys.executable, "-m", "reach", "up", "--port", str(port), *args]
    if demo_port is not None:
        argv += ["--demo-port", str(demo_port)]
    else:
        argv.append("--no-demo")
    stdout = home / "up.out"
    with stdout.open("wb") as out, (home / "up.err").open("wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=err)
    up = Up(proc, home, port, stdout)
    try:
        yield up
    finally:
        if proc.poll() is None:
            left = up.children()
            proc.kill()
            proc.wait()
            for child in left:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass


def wait_banner(up: Up) -> None:
    def ready() -> bool:
        if up.proc.poll() is not None:
            raise AssertionError(
                f"reach up exited with {up.proc.returncode}:\n{up.said()}\n"
                + (up.home / "up.err").read_text()
            )
        return "Agent-Reach is up" in up.said()

    wait_until(ready, timeout=60, interval=0.2, what="the banner")


def assert_all_gone(children: list[psutil.Process], *ports: int) -> None:
    """Every child process has exited (within a few seconds) and the ports are free."""
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises if anything still holds it


def test_banner_quiet_terminal_logs_in_home_and_sigint_stops_everything(tmp_path: Path) -> None:
    demo_port = free_block(len(DEMO))
    with reach_up(tmp_path, demo_port=demo_port) as up:
        wait_banner(up)
        online = re.compile(r"online\s+(\S+)")
        wait_until(
            lambda: set(online.findall(up.said())) >= DEMO,
            timeout=40,
            interval=0.25,
            what="a line for each demo agent online",
        )
        logs = tmp_path / "logs"
        # the beat's ticks ran on the worker (its INFO lines are the noise kept out of sight)
        wait_until(
            lambda: "reach.outbox_relay" in (logs / "worker.log").read_text(errors="replace"),
            timeout=30,
            what="Celery's INFO lines in worker.log",
        )
        children = up.children()
        assert len(children) >= 3 + len(DEMO)  # api, worker (+ its pool), beat, the agents
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=40) == 0, up.said()
        assert_all_gone(children, up.port, *range(demo_port, demo_port + len(DEMO)))

    said = up.said()
    hub = f"http://127.0.0.1:{up.port}"
    assert f"hub        {hub}" in said
    assert f"dashboard  {hub}/ui" in said
    assert "flower     needs Redis or RabbitMQ" in said  # the embedded broker
    assert "auth is off: the API listens on loopback only" in said
    assert f"logs       {tmp_path / 'logs'}/" in said
    assert "all demo agents online" in said
    noisy = [line for line in said.splitlines() if NOISE.search(line)]
    assert not noisy, said
    assert len(said.splitlines()) < 25, said  # a banner, the agents, the goodbye
    assert (tmp_path / "up.err").read_text() == ""
    # what the terminal did not show is in the logs
    assert "Application startup complete" in (logs / "api.log").read_text()
    assert "beat: Starting" in (logs / "beat.log").read_text()
    assert "celery@" in (logs / "worker.log").read_text()
    assert "summarizer-01" in (logs / "summarizer.log").read_text()
    # the demo agents deregistered on the way out (the API stopped after them)
    engine = create_engine_for(f"sqlite:///{tmp_path}/reach.db")
    try:
        with session_factory(engine)() as s:
            assert {r.status for r in s.scalars(select(InstanceRow))} == {"deregistered"}
    finally:
        engine.dispose()


def test_with_auth_on_the_demo_agents_get_keys_that_never_show_and_are_revoked(
    tmp_path: Path,
) -> None:
    demo_port = free_block(len(DEMO))
    with reach_up(tmp_path, demo_port=demo_port, REACH_SECURITY__REQUIRE_AUTH="true") as up:
        wait_banner(up)
        wait_until(
            lambda: "all demo agents online" in up.said(),
            timeout=40,
            interval=0.25,
            what="the demo agents online behind auth",
        )
        hub = f"http://127.0.0.1:{up.port}"
        assert requests.get(f"{hub}/api/v1/agents", timeout=5).status_code == 401
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=40) == 0, up.said()
    said = up.said()
    assert "auth       on: API keys required; each demo agent got a key of its own" in said
    assert "reach keys create --scope admin" in said and "auth is off" not in said
    written = said + "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").iterdir())
    assert "rk_" not in written  # no secret on the terminal or in a log
    engine = create_engine_for(f"sqlite:///{tmp_path}/reach.db")
    try:
        with session_factory(engine)() as s:
            keys = list(s.scalars(select(ApiKeyRow)))
    finally:
        engine.dispose()
    assert {k.agent_pattern for k in keys} == {*DEMO, None}  # one per agent, one viewer
    assert all(k.revoked_at is not None for k in keys)


# How each supervisor is stopped; all of them run at once (a hub each, on its own home).
STOPS = {
    "sigterm-verbose": ("SIGTERM",),
    "sighup": ("SIGHUP",),
    # the terminal closed while Ctrl-C's shutdown was under way (it orphaned `reach api`)
    "sigint-then-sighup": ("SIGINT", "SIGHUP"),
    # no handler can run: the children's PR_SET_PDEATHSIG takes them down
    "sigkill": ("SIGKILL",),
}


def test_no_child_outlives_the_supervisor(tmp_path: Path) -> None:
    with contextlib.ExitStack() as running:
        ups: dict[str, Up] = {}
        for case in STOPS:
            home = tmp_path / case
            home.mkdir()
            args = ["--concurrency", "1"] + (["--verbose"] if "verbose" in case else [])
            ups[case] = running.enter_context(reach_up(home, *args))
        children: dict[str, list[psutil.Process]] = {}
        for case, up in ups.items():
            wait_banner(up)
            if "verbose" in case:  # the processes' own output streams to the terminal
                wait_until(lambda up=up: "celery@" in up.said(), timeout=30, what="worker banner")
            children[case] = up.children()
            names = {" ".join(p.cmdline()[2:4]) for p in children[case]}
            assert {"reach api", "reach worker", "reach beat"} <= names, (case, names)
        for case, up in ups.items():
            for name in STOPS[case]:
                up.proc.send_signal(getattr(signal, name))
        for case, up in ups.items():
            code = up.proc.wait(timeout=40)
            assert_all_gone(children[case], up.port)
            if case != "sigkill":
                assert code == 0, (case, code, up.said())
    verbose = ups["sigterm-verbose"]
    said = verbose.said() + (verbose.home / "up.err").read_text()
    assert "Application startup complete" in said and "beat: Starting" in said
    assert not (verbose.home / "logs").exists()  # ... and into no log file


def test_a_busy_port_is_refused_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = hub_env("", tmp_path)
    env.pop("REACH_DATABASE_URL")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runs = [
            ["--port", str(port), "--no-demo"],  # a second `reach up` on the API's port
            ["--port", str(free_port()), "--demo-port", str(port)],  # or on a demo agent's
        ]
        procs = [  # both at once: each spends its seconds importing
            subprocess.Popen(
                [sys.executable, "-m", "reach", "up", *args],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for args in runs
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 2, out + err
            assert out == "" and "Traceback" not in err
            lines = err.strip().splitlines()
            assert len(lines) == 1 and f"port {port}" in lines[0], err
            assert "--port" in lines[0] or "--demo-port" in lines[0]
    assert "already in use" in lines[0]
    # nothing started: no store, no logs, no process running with this REACH_HOME
    assert not (tmp_path / "reach.db").exists() and not (tmp_path / "logs").exists()
    mine = [p for p in psutil.process_iter(["pid"]) if _home_of(p) == str(tmp_path)]
    assert not mine, [p.cmdline() for p in mine]


def _home_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get("REACH_HOME")
    except (psutil.Error, OSError):
        return None


def test_the_supervisor_survives_a_closed_terminal_while_printing(tmp_path: Path) -> None:
    """stdout gone (EPIPE on every write) before SIGHUP: the shutdown still runs to the end."""
    read, write = os.pipe()
    env = hub_env("", tmp_path)
    env.pop("REACH_DATABASE_URL")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reach", "up", "--port", str(port), "--no-demo"],
        env=env,
        cwd=REPO,
        stdout=write,
        stderr=write,
    )
    os.close(write)
    reader = os.fdopen(read, "rb")
    try:
        seen = b""
        while b"Agent-Reach is up" not in seen:
            chunk = reader.read1(4096)
            assert chunk, seen
            seen += chunk
        children = list(psutil.Process(proc.pid).children(recursive=True))
        reader.close()  # the terminal is gone: the next line it prints fails
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=40) == 0  # a clean stop, not an exit from a failed print
        assert_all_gone(children, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
