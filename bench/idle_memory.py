"""What an idle hub holds, process by process, and what its entry modules take to import.

An idle hub's memory is mostly the modules each process imported (anything imported
before the worker forks counts once per prefork child), so this is where an import the
process never uses shows. ``python -m bench.idle_memory`` starts the bench's hub (API,
worker with prefork x2, beat, on PostgreSQL and Redis as ``bench.processes.Hub`` starts
them), waits for it to settle, and prints each process's RSS and PSS (PSS shares the
pages a prefork child still has in common with its parent) and their sums; then the CPU
seconds a fresh interpreter takes to import the API's and the worker's application.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.processes import Hub

ENTRY_MODULES = ("reach.hub.api", "reach.worker.app")


def _role(proc: psutil.Process) -> str:
    """Which ``reach`` command a hub process runs (``api``, ``worker``, ``beat``)."""
    line = " ".join(proc.cmdline())
    return next((role for role in ("api", "worker", "beat") if f" {role}" in line), "?")


def snapshot(pids: list[int]) -> list[tuple[str, float, float]]:
    """(role, RSS MB, PSS MB) of each hub process and its children."""
    rows = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            role = _role(root)
            for proc, name in [(root, role)] + [
                (child, f"{role} child") for child in root.children(recursive=True)
            ]:
                with contextlib.suppress(psutil.Error):
                    full = proc.memory_full_info()
                    rows.append((name, full.rss / 1_048_576, full.pss / 1_048_576))
    return rows


def import_cpu_s(module: str) -> float:
    """User + system CPU seconds of ``python -c 'import module'`` (bytecode already
    compiled: what a start-up pays)."""
    code = (
        "import resource, time; import " + module + "; "
        "r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds after start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        hub = Hub(Path(home)).start()
        try:
            time.sleep(args.settle)
            rows = snapshot(hub.pids())
        finally:
            hub.stop()
    for role, rss, pss in rows:
        print(f"{role:14} RSS {rss:7.1f} MB   PSS {pss:7.1f} MB")
    print(
        f"{'summed':14} RSS {sum(r[1] for r in rows):7.1f} MB   "
        f"PSS {sum(r[2] for r in rows):7.1f} MB"
    )
    for module in ENTRY_MODULES:
        runs = sorted(import_cpu_s(module) for _ in range(3))
        print(f"import {module}: {runs[1]:.2f} s CPU (median of 3)")


if __name__ == "__main__":
    main()
