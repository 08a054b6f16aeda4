"""Ports for the test's own servers, picked so that no two of them are ever handed the same
one and none is taken by somebody else between the pick and the bind.

The kernel's ``bind(port 0)`` draws from the ephemeral range (32768-60999 here), which is
also where every outgoing connection gets its local port: a port picked that way, released,
and bound seconds later by a slow-starting child can meanwhile be handed again, to the next
pick or to a client socket, and the child dies with EADDRINUSE. So ports come from below
that range instead, each process of the run from its own slice (xdist workers apart; a
random start apart from its children), walked in order so none repeats within a process.
"""

from __future__ import annotations

import os
import random
import socket
import threading

LOW, HIGH = 20_000, 32_000  # below the kernel's ephemeral ports
SLICES = 4


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    size = (HIGH - LOW) // SLICES
    return range(LOW + index * size, LOW + (index + 1) * size)


_lock = threading.Lock()
_ports = _slice()
_next = random.randrange(len(_ports))


def free_port() -> int:
    """A port on 127.0.0.1 that is free now and that this process has not handed out."""
    return free_block(1)


def free_block(size: int) -> int:
    """The first of ``size`` consecutive ports, all free now and none handed out before
    (`reach up` puts its demo agents on consecutive ports)."""
    global _next
    with _lock:
        for _ in range(len(_ports)):
            base = _ports.start + _next % len(_ports)
            if base + size > _ports.stop:
                _next += _ports.stop - base  # wrap: a block never leaves the slice
                continue
            taken = next((p for p in range(base, base + size) if not _bindable(p)), None)
            if taken is None:
                _next += size
                return base
            _next += taken - base + 1
    raise RuntimeError(f"no {size} free consecutive ports left in {_ports.start}-{_ports.stop - 1}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False  # in use (or lingering in TIME_WAIT)
        return True
