"""A real PgBouncer (Debian's package) in front of the local PostgreSQL, in transaction
mode, on a port of its own: what seed 003's stage 2 puts between the hub and its database."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@contextmanager
def pgbouncer(*, pool_size: int = 4, max_clients: int = 2000) -> Iterator[int]:
    """PgBouncer on 127.0.0.1, transaction pooling, ``pool_size`` server connections per
    database and user; yields its port. Run as ``postgres`` when this is root (PgBouncer
    refuses root), from a directory of its own that user can read."""
    directory = Path(tempfile.mkdtemp(prefix="reach-pgbouncer-"))
    port = free_port()
    users = directory / "userlist.txt"
    users.write_text('"postgres" ""\n')
    config = directory / "pgbouncer.ini"
    log = directory / "pgbouncer.log"
    config.write_text(
        "[databases]\n"
        "* = host=127.0.0.1 port=5432\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir =\nauth_type = trust\nauth_file = {users}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\n"
        f"max_client_conn = {max_clients}\nlogfile = {log}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    argv = [PGBOUNCER, str(config)]
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in (directory, users, config):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        argv = ["runuser", "-u", "postgres", "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                said = log.read_text() if log.exists() else ""
                raise AssertionError(f"pgbouncer exited with {proc.returncode}: {said}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("pgbouncer did not listen within 15 s") from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
