"""The README's benchmark table is the latest full run's ``bench/results/latest.md``,
byte for byte (``python -m bench --readme`` writes both)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import readme


def test_the_readme_table_is_the_latest_full_run() -> None:
    assert readme.block(readme.README.read_text()) == (
        (readme.RESULTS / "latest.md").read_text().strip()
    )
    meta = json.loads((readme.RESULTS / "latest.json").read_text())["meta"]
    assert meta.get("level", "full") == "full" and not meta.get("only"), meta


def test_a_table_replaces_only_the_block() -> None:
    text = f"intro\n{readme.START}\nold\n{readme.END}\nafter\n"
    new = readme.with_table(text, "| a |\n")
    assert new == f"intro\n{readme.START}\n| a |\n{readme.END}\nafter\n"
    assert readme.block(new) == "| a |"


@pytest.mark.parametrize("text", ["no markers", f"{readme.END} x {readme.START}"])
def test_a_readme_without_its_block_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        readme.with_table(text, "| a |")


def test_only_a_full_run_of_every_part_goes_into_the_readme(tmp_path: Path) -> None:
    (tmp_path / "latest.md").write_text("| quick |\n")
    (tmp_path / "latest.json").write_text(
        json.dumps({"meta": {"command": "python -m bench --quick", "level": "quick"}})
    )
    target = tmp_path / "README.md"
    target.write_text(f"{readme.START}\nold\n{readme.END}\n")
    with pytest.raises(SystemExit):
        readme.update(tmp_path, target)
    assert "old" in target.read_text()


def test_a_full_run_in_which_a_part_failed_stays_out_of_the_readme(tmp_path: Path) -> None:
    (tmp_path / "latest.md").write_text("| gap |\n")
    meta = {"command": "python -m bench", "level": "full", "failed": {"soak": "OSError: x"}}
    (tmp_path / "latest.json").write_text(json.dumps({"meta": meta}))
    target = tmp_path / "README.md"
    target.write_text(f"{readme.START}\nold\n{readme.END}\n")
    with pytest.raises(SystemExit, match="soak"):
        readme.update(tmp_path, target)
    assert "old" in target.read_text()
