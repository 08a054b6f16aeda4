"""Ending a test's child process: SIGKILL at once, or SIGTERM with a SIGKILL fallback."""

from __future__ import annotations

import subprocess


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` if it still runs, and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10) -> None:
    """SIGTERM ``proc`` if it still runs; SIGKILL it if it has not left within ``timeout``."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill(proc)
