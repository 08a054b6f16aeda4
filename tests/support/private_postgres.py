"""A PostgreSQL cluster of the test run's own, on a free port, that a test may stop and start.

Fault tests must never stop the shared server on 5432 (other engineers' tests use it), so
they get this one: ``initdb`` into a temporary directory owned by the ``postgres`` user
(PostgreSQL refuses to run as root), trust authentication on 127.0.0.1 only, and the
durability knobs turned off (a test cluster is thrown away; a clean stop still flushes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from tests.support.ports import free_port

PG_BIN = Path(os.environ.get("REACH_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
OS_USER = os.environ.get("REACH_TEST_PG_OS_USER", "postgres")


class PrivatePostgres:
    """One cluster: `start`, `stop` (a fast shutdown: sessions are cut off), `url_for`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="reach-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        shutil.chown(self.root, OS_USER, OS_USER)

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            command = ["runuser", "-u", OS_USER, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def init(self) -> None:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=3"

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "-o", options, "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def accepting(self) -> bool:
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        name = f"reach_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url_for(name)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


def started_cluster() -> PrivatePostgres:
    """Initialise and start a cluster, waiting until it accepts connections."""
    cluster = PrivatePostgres()
    try:
        cluster.init()
        cluster.start()
        deadline = time.monotonic() + 30
        while not cluster.accepting():
            if time.monotonic() > deadline:
                raise RuntimeError(f"private PostgreSQL did not start: {cluster.log}")
            time.sleep(0.1)
    except BaseException:
        cluster.destroy()
        raise
    return cluster
