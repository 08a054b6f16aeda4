"""The README's benchmark table is ``bench/results/latest.md`` of a full run, verbatim.

``python -m bench --readme`` runs the full table and then writes it between the README's
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers; ``python -m bench.readme``
writes the latest full run's table there again without running anything. A test keeps
the two equal (tests/bench/test_readme_table.py), so a figure in the README always comes
from the run whose files are beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.processes import REPO

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
README = REPO / "README.md"
RESULTS = REPO / "bench" / "results"


def block(readme: str) -> str:
    """The table between the markers (stripped)."""
    try:
        a = readme.index(START) + len(START)
        b = readme.index(END, a)
    except ValueError:
        raise ValueError(f"the README has no {START} ... {END} block") from None
    return readme[a:b].strip()


def with_table(readme: str, table: str) -> str:
    """``readme`` with its block replaced by ``table``."""
    block(readme)  # both markers, in order
    a = readme.index(START) + len(START)
    b = readme.index(END, a)
    return readme[:a] + "\n" + table.strip() + "\n" + readme[b:]


def update(results: Path = RESULTS, readme: Path = README) -> None:
    """Write ``results/latest.md`` into the README; only a full run of every part may."""
    meta = json.loads((results / "latest.json").read_text())["meta"]
    if meta.get("level", "full") != "full" or meta.get("only"):
        raise SystemExit(
            f"bench/results/latest.json is from `{meta['command']}`: the README takes a full "
            "run of every part (python -m bench --readme)"
        )
    if meta.get("failed"):
        raise SystemExit(
            f"bench/results/latest.json is a full run in which parts failed "
            f"({', '.join(sorted(meta['failed']))}): the README takes a complete run"
        )
    readme.write_text(with_table(readme.read_text(), (results / "latest.md").read_text()))


def main() -> None:
    update()
    print(f"{README.name}: table from {RESULTS / 'latest.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
