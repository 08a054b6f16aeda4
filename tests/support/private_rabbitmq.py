"""A RabbitMQ node of the test's own (free ports, temporary directory) that it may stop and
start without disturbing the shared node on 5672 other engineers' tests use.

The node runs as the ``rabbitmq`` user when the tests run as root (its Erlang cookie is
what ``rabbitmqctl`` authenticates with), else as the current user. Its config names only
its own listener, so the system's ``rabbitmq.conf`` (which binds 5672) is never read; no
plugins. A restart keeps its mnesia directory: durable queues and persistent messages
survive, as they do when a production broker restarts.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

SERVER = os.environ.get("REACH_TEST_RABBITMQ_SERVER", "/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = os.environ.get("REACH_TEST_RABBITMQ_CTL", "/usr/lib/rabbitmq/bin/rabbitmqctl")
OS_USER = os.environ.get("REACH_TEST_RABBITMQ_OS_USER", "rabbitmq")


def available() -> bool:
    """Whether a private node can be started here (the server script is installed)."""
    return Path(SERVER).exists() and Path(CTL).exists()


class PrivateRabbitMQ:
    """One node: `start` (waits until it takes AMQP connections), `stop`, `destroy`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="reach-rabbit-"))
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"reach-test-{os.getpid()}-{self.port}@localhost"
        (self.root / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.root / "enabled_plugins").write_text("[].\n")
        self._as_root = os.geteuid() == 0
        if self._as_root:
            for path in (self.root, *self.root.iterdir()):
                shutil.chown(path, OS_USER, OS_USER)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _command(self, *args: str) -> list[str]:
        if not self._as_root:
            return list(args)
        home = pwd.getpwnam(OS_USER).pw_dir  # where the node's Erlang cookie lives
        return ["runuser", "-u", OS_USER, "--", "env", f"HOME={home}", *args]

    def start(self, timeout: float = 30) -> float:
        """Start the node; returns how long it took to take connections (seconds)."""
        started = time.monotonic()
        env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
        }
        names = [k for k in env if k.startswith("RABBITMQ_")]
        settings = [f"{k}={env[k]}" for k in names] if self._as_root else []
        subprocess.run(
            self._command(*settings, SERVER, "-detached"),
            env=env,
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = started + timeout
        while not self.accepting():
            if time.monotonic() > deadline:
                raise RuntimeError(f"private RabbitMQ did not start: {self.root / 'log'}")
            time.sleep(0.1)
        return time.monotonic() - started

    def accepting(self) -> bool:
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=1) as conn:
                conn.ensure_connection(max_retries=1, timeout=1)
            return True
        except Exception:
            return False

    def ctl(self, *args: str) -> None:
        subprocess.run(
            self._command(CTL, "-n", self.node, *args), check=True, capture_output=True, timeout=60
        )

    def add_vhost(self, name: str, queue_policy: dict[str, Any] | None = None) -> str:
        """A virtual host of its own (guest may use it), optionally with a policy on every
        queue in it; returns its AMQP URL."""
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        if queue_policy:
            policy = json.dumps(queue_policy)
            self.ctl("set_policy", "-p", name, "--apply-to", "queues", "test", ".*", policy)
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """A clean stop (``rabbitmqctl stop``): every connection is cut."""
        self.ctl("stop")
        while self.accepting():
            time.sleep(0.05)

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)


def started_node() -> PrivateRabbitMQ:
    node = PrivateRabbitMQ()
    try:
        node.start()
    except BaseException:
        node.destroy()
        raise
    return node
