"""The DAG package's shape: its surface resolves, and importing it needs no PyYAML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reach.core.orchestration import dags

PACKAGE_DIR = Path(dags.__file__).resolve().parent


@pytest.mark.parametrize("name", dags.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(dags, name) is not None


def test_no_module_beside_the_package() -> None:
    assert not (PACKAGE_DIR.parent / "dags.py").exists()


def test_validate_is_the_function_not_the_module() -> None:
    assert callable(dags.validate)
    assert dags.validate.__module__ == "reach.core.orchestration.dags.validation"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import reach.core.orchestration.dags", "absent"),
        (
            "from reach.core.orchestration.dags import load_dag\n"
            'load_dag(\'{"name": "x", "nodes": [{"id": "a", "agent_id": "a",'
            ' "method": "m"}]}\', \'json\')',
            "absent",
        ),
        (
            "from reach.core.orchestration.dags import load_dag\n"
            "load_dag('name: x\\nnodes: []\\n', 'yaml')",
            "present",
        ),
    ],
    ids=["import", "json-load", "yaml-load"],
)
def test_yaml_is_imported_only_to_load_yaml(code: str, expected: str) -> None:
    """A fresh interpreter: PyYAML enters ``sys.modules`` only when a YAML document is loaded."""
    probe = (
        "import sys\n"
        "try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) + "except Exception:\n"
        "    pass\n"
        "print('present' if 'yaml' in sys.modules else 'absent')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == expected
