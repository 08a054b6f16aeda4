"""The benchmark table of ``docs/benchmarks.md`` is ``bench/results/latest.md`` of a full
run, verbatim.

``python -m bench --readme`` runs the full table and then writes it between the page's
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers; ``python -m bench.readme``
writes the latest full run's table there again without running anything, and
``python -m bench.readme --rescore`` first judges that run's measurements by the targets
as the code states them now (a rule corrected after the run). A test keeps
the two equal (tests/bench/test_readme_table.py), so a figure in the docs always comes
from the run whose files are beside it. (The names say README: the table lived there
until the docs took it; the commands recorded in past runs' files keep working.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from bench.processes import REPO

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
PAGE = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "bench" / "results"


def block(page: str) -> str:
    """The table between the markers (stripped)."""
    try:
        a = page.index(START) + len(START)
        b = page.index(END, a)
    except ValueError:
        raise ValueError(f"the page has no {START} ... {END} block") from None
    return page[a:b].strip()


def with_table(page: str, table: str) -> str:
    """``page`` with its block replaced by ``table``."""
    block(page)  # both markers, in order
    a = page.index(START) + len(START)
    b = page.index(END, a)
    return page[:a] + "\n" + table.strip() + "\n" + page[b:]


def update(results: Path = RESULTS, page: Path = PAGE) -> None:
    """Write ``results/latest.md`` into the page; only a full run of every part may."""
    _full_run(json.loads((results / "latest.json").read_text())["meta"])
    page.write_text(with_table(page.read_text(), (results / "latest.md").read_text()))


def rescore(results: Path = RESULTS, page: Path = PAGE, now: dt.datetime | None = None) -> None:
    """Judge the latest full run's measurements by the targets as they are now, then write
    its table into the page.

    Only the verdicts change: ``latest.json`` gets the new ``targets`` and says when they
    were judged again (``meta.rescored``), ``latest.md`` is rendered again from it, and the
    dated copy stays as the run wrote it."""
    from bench import cli, report, soak  # cli imports this module

    result: dict[str, Any] = json.loads((results / "latest.json").read_text())
    _full_run(result["meta"])
    if result.get("soak"):  # the figures the soak's targets are judged on
        for key, column in (("p99_drift", "p99_ms"), ("rss_drift", "rss_mb")):
            result["soak"][key] = soak.drift(result["soak"]["windows"], column)
    result["targets"] = [t.as_dict() for t in cli.targets(result)]
    at = (now or dt.datetime.now(dt.UTC)).replace(microsecond=0).isoformat()
    result["meta"]["rescored"] = {"at": at, "command": "python -m bench.readme --rescore"}
    report.write_latest(result, results)
    update(results, page)


def _full_run(meta: dict[str, Any]) -> None:
    """Refuse anything but a complete full run of every part."""
    if meta.get("level", "full") != "full" or meta.get("only"):
        raise SystemExit(
            f"bench/results/latest.json is from `{meta['command']}`: the table takes a full "
            "run of every part (python -m bench --readme)"
        )
    if meta.get("failed"):
        raise SystemExit(
            f"bench/results/latest.json is a full run in which parts failed "
            f"({', '.join(sorted(meta['failed']))}): the table takes a complete run"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.readme", description=__doc__)
    p.add_argument(
        "--rescore",
        action="store_true",
        help="first judge the latest full run by the targets as the code states them now",
    )
    if p.parse_args(argv).rescore:
        rescore()
    else:
        update()
    print(f"{PAGE}: table from {RESULTS / 'latest.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
