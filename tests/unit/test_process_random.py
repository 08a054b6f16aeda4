"""Each forked worker child draws its own jitter (Celery imports task modules before fork)."""

from __future__ import annotations

import os
import random
import struct

import pytest


def _draws_in_children(rng: random.Random, children: int = 3) -> list[float]:
    """Fork ``children`` processes; each sends back its first draw from ``rng``."""
    draws = []
    for _ in range(children):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: one draw, then leave without running pytest's teardown
            os.write(write, struct.pack("d", rng.random()))
            os._exit(0)
        os.close(write)
        draws.append(struct.unpack("d", os.read(read, 8))[0])
        os.close(read)
        os.waitpid(pid, 0)
    return draws


def test_a_plain_random_made_before_fork_repeats_in_every_child() -> None:
    """The trap: this is what a module-level ``random.Random()`` gives prefork children."""
    draws = _draws_in_children(random.Random())
    assert len(set(draws)) == 1


def test_process_random_differs_in_every_child() -> None:
    from reach.worker.process_random import process_random

    draws = _draws_in_children(process_random())
    assert len(set(draws)) == len(draws)


@pytest.mark.parametrize("module", ["reach.tasks.delivery", "reach.tasks.outbox"])
def test_task_modules_jitter_differs_per_child(module: str) -> None:
    import importlib

    rng = importlib.import_module(module)._rng
    draws = _draws_in_children(rng)
    assert len(set(draws)) == len(draws)
