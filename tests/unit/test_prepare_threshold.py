"""``?prepare_threshold=`` in a PostgreSQL URL: taken out of the URL, given to psycopg."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from reach.hub.storage.engine import _UNSET, _prepare_threshold

BASE = "postgresql+psycopg://reach@db:6432/reach"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", _UNSET),
        ("?prepare_threshold=none", None),
        ("?prepare_threshold=None", None),
        ("?prepare_threshold=off", None),
        ("?prepare_threshold=0", 0),
        ("?prepare_threshold=5", 5),
        ("?sslmode=disable&prepare_threshold=none", None),
    ],
)
def test_the_option_leaves_the_url(query: str, expected: object) -> None:
    url, threshold = _prepare_threshold(make_url(BASE + query))
    assert threshold is expected if expected in (None, _UNSET) else threshold == expected
    assert "prepare_threshold" not in url.query
    if "sslmode" in query:
        assert url.query["sslmode"] == "disable"  # libpq's own options stay


@pytest.mark.parametrize(
    "query",
    [
        "?prepare_threshold=-1",
        "?prepare_threshold=many",
        "?prepare_threshold=1&prepare_threshold=2",
    ],
)
def test_what_it_may_not_be(query: str) -> None:
    with pytest.raises(ValueError, match="prepare_threshold"):
        _prepare_threshold(make_url(BASE + query))
