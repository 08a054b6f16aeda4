"""A random source of each worker process's own.

Celery imports task modules in the parent and then forks its prefork children; a
``random.Random()`` made at import is copied into every child with the same state, so each
child would draw the same retry jitter (and the same tie-breaks) at the same moment —
jitter that is the same everywhere is no jitter. Only the module-level ``random`` is
reseeded after fork, so our own instances are reseeded here.
"""

from __future__ import annotations

import os
import random


def process_random() -> random.Random:
    """A ``Random`` seeded from the OS now and again in every child forked later."""
    rng = random.Random()
    os.register_at_fork(after_in_child=rng.seed)
    return rng
