"""What the hub tells an operator whose PostgreSQL will not clean up after it."""

from __future__ import annotations

import pytest

from reach.hub.storage.engine import autovacuum_verdict


@pytest.mark.parametrize(
    ("autovacuum", "track_counts", "named"),
    [
        ("on", "on", None),
        ("off", "on", "(autovacuum = off)"),
        ("on", "off", "(track_counts = off)"),  # autovacuum then never finds a table
        ("off", "off", "(autovacuum = off, track_counts = off)"),
    ],
)
def test_autovacuum_verdict(autovacuum: str, track_counts: str, named: str | None) -> None:
    verdict = autovacuum_verdict(autovacuum, track_counts)
    if named is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert named in verdict
        assert "VACUUM the tasks and outbox tables" in verdict
        assert "docs/operations.md" in verdict
