"""Acceptance runs on PostgreSQL + Redis: the both-store matrix belongs to tests/integration,
where the contract tests are. ``reach up`` on the embedded default keeps its smoke tests
(test_reach_up.py, test_readme_commands.py), and a test may still ask for SQLite by
parametrising ``store_url`` indirectly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stores import POSTGRES, fresh_store


@pytest.fixture(params=[POSTGRES])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty PostgreSQL database (the hub's ``stack`` puts Redis beside it)."""
    with fresh_store(request.param, tmp_path, request) as url:
        yield url


@pytest.fixture(scope="module", params=[POSTGRES])
def shared_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One PostgreSQL database for a whole test module (see ``shared_stack``)."""
    with fresh_store(request.param, tmp_path_factory.mktemp("store"), request) as url:
        yield url
