"""``python -m bench.compare --before REV``: the fast path's cost, before and after, in one run.

A change for slow agents must not make fast ones dearer: CPU per message (the ``cost``
part: each process's CPU per single hop at a fixed rate) and the max single-hop
throughput (the ``max_throughput`` ladder) must not get worse. Two runs on different
days or boxes cannot tell that apart (docs/benchmarks.md: the same box's speed drifts by
a third within an hour), so this runs both codes in one sitting, alternating:

- ``before``: a temporary ``git worktree add --detach`` of REV, its own bench and hub
  (``python -m bench --only ...`` with that tree as cwd and ``PYTHONPATH``, the same
  Python and packages);
- ``after``: the same command in this tree, uncommitted changes included.

``--rounds N`` runs N rounds, each a before and an after, the order alternating (before,
after, after, before, ...) so a box that slows down through the run weighs on both
alike. Printed: each figure's median per side, every run's value, and after ÷ before;
written to ``bench/results/<stamp>-compare.json``. The worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PARTS = ("cost", "max_throughput")
ROLES = ("api", "worker", "beat", "postgres", "redis", "agent")
FIGURES = (  # (key in `figures`, how the table names it); CPU is per message, ms
    *((f"cpu.{role}", f"CPU ms/msg: {role}") for role in ROLES),
    ("cpu.hub", "CPU ms/msg: hub (api + worker + beat + postgres + redis)"),
    ("cpu.total", "CPU ms/msg: every process"),
    ("max_throughput", "max single hop, msg/s (p99 ≤ 100 ms)"),
    ("calibration_ms", "machine calibration, ms (bench.calibrate)"),
)


def order(rounds: int) -> list[str]:
    """Which code each run measures: before, after, then after, before, and so on."""
    sides = []
    for n in range(rounds):
        sides += ["before", "after"] if n % 2 == 0 else ["after", "before"]
    return sides


def figures(result: dict[str, Any]) -> dict[str, float | None]:
    """A bench run's figures this compares (None where its part did not run)."""
    cost = result.get("cost") or {}
    per_role = cost.get("cpu_ms_per_msg") or {}
    out: dict[str, float | None] = {f"cpu.{role}": per_role.get(role) for role in ROLES}
    out["cpu.hub"] = cost.get("hub_cpu_ms_per_msg")
    out["cpu.total"] = cost.get("total_cpu_ms_per_msg")
    out["max_throughput"] = result.get("max_throughput")
    out["calibration_ms"] = ((result.get("meta") or {}).get("calibration") or {}).get(
        "calibration_ms"
    )
    return out


def compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per figure: every run's value per side, each side's median, after ÷ before.
    A run that failed (``error``) counts for neither."""
    rows = []
    for key, name in FIGURES:
        values: dict[str, list[float]] = {"before": [], "after": []}
        for run in runs:
            value = (run.get("figures") or {}).get(key)
            if "error" not in run and isinstance(value, int | float):
                values[run["side"]].append(float(value))
        if not values["before"] and not values["after"]:
            continue
        before = statistics.median(values["before"]) if values["before"] else None
        after = statistics.median(values["after"]) if values["after"] else None
        rows.append(
            {
                "figure": key,
                "name": name,
                "before": before,
                "after": after,
                "before_runs": values["before"],
                "after_runs": values["after"],
                "after_to_before": round(after / before, 3) if before and after else None,
            }
        )
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def table(comparison: dict[str, Any]) -> str:
    """The comparison as Markdown: the median of each side, every run, and the ratio."""
    before, after = comparison["before"], comparison["after"]
    lines = [
        f"| figure | before: {before['label']} | after: {after['label']} | after ÷ before |",
        "|---|---|---|---|",
    ]
    for row in comparison["rows"]:
        cells = []
        for side in ("before", "after"):
            runs = row[f"{side}_runs"]
            shown = _fmt(row[side])
            if len(runs) > 1:
                shown += " (" + ", ".join(_fmt(v) for v in runs) + ")"
            cells.append(shown)
        ratio = row["after_to_before"]
        lines.append(
            f"| {row['name']} | {cells[0]} | {cells[1]} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    failed = [r for r in comparison["runs"] if "error" in r]
    lines += [f"\nrun {r['n']} ({r['side']}) failed: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A detached worktree of ``rev`` for the run, removed (forced) afterwards."""
    where = Path(tempfile.mkdtemp(prefix="reach-before-"))
    tree = where / "tree"
    _git("worktree", "add", "--detach", str(tree), rev)
    try:
        yield tree
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(where, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "prune")


def run_bench(tree: Path, parts: list[str], level: str, out: Path) -> dict[str, Any]:
    """``python -m bench --only parts`` on the code of ``tree``; its ``latest.json``.
    Its progress goes to stderr as it runs; its table to ``out/stdout.md``."""
    argv = [sys.executable, "-m", "bench", "--only", *parts, "--out", str(out)]
    if level != "full":
        argv.append(f"--{level}")
    env = {**os.environ, "PYTHONPATH": str(tree)}  # its bench, and the hubs it spawns
    out.mkdir(parents=True, exist_ok=True)
    with (out / "stdout.md").open("w") as stdout:
        done = subprocess.run(argv, cwd=tree, env=env, stdout=stdout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"python -m bench exited {done.returncode} (see {out / 'stdout.md'})")
    result: dict[str, Any] = json.loads((out / "latest.json").read_text())
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    p.add_argument("--before", required=True, help="the revision to compare with (a commit)")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rounds", type=int, default=2, help="rounds of before and after")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    level = "smoke" if args.smoke else "quick" if args.quick else "full"
    started = dt.datetime.now(dt.UTC)
    rev = _git("rev-parse", "--verify", f"{args.before}^{{commit}}")
    head = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    runs: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="reach-compare-"))
    try:
        with worktree(rev) as before_tree:
            trees = {"before": before_tree, "after": REPO}
            for n, side in enumerate(order(args.rounds), 1):
                print(f"== run {n}: {side} ({trees[side]})", file=sys.stderr, flush=True)
                run: dict[str, Any] = {"n": n, "side": side}
                try:
                    result = run_bench(trees[side], args.only, level, scratch / f"{n}-{side}")
                    run["figures"] = figures(result)
                    run["cost"] = result.get("cost")
                    run["max_throughput_runs"] = (result.get("details") or {}).get(
                        "max_throughput_runs"
                    )
                    if result["meta"].get("failed"):
                        run["error"] = f"parts failed: {result['meta']['failed']}"
                except (RuntimeError, OSError, ValueError) as exc:
                    run["error"] = str(exc)
                runs.append(run)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python -m bench.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    comparison = {
        "meta": {
            "command": command,
            "started": started.isoformat(timespec="seconds"),
            "level": level,
            "parts": args.only,
            "rounds": args.rounds,
            "machine": f"{os.cpu_count()} cores, one box",
        },
        "before": {"rev": rev, "label": rev[:7]},
        "after": {"rev": head, "dirty": dirty, "label": head[:7] + (" + changes" if dirty else "")},
        "runs": runs,
        "rows": compare(runs),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{started.strftime('%Y%m%dT%H%M%S')}-compare.json"
    path.write_text(json.dumps(comparison, indent=2) + "\n")
    print(table(comparison))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
