"""`reach.core.security.lockout`: when an address is locked out, and whose failures are whose."""

from __future__ import annotations

import pytest

from reach.core.security.lockout import LockoutPolicy, client_key, locked_for

POLICY = LockoutPolicy(max_failures=3, window_s=60.0)


@pytest.mark.parametrize(
    ("failures", "now", "expected"),
    [
        ((), 100.0, None),  # never failed
        ((90.0, 95.0), 100.0, None),  # below the limit
        ((90.0, 95.0, 99.0), 100.0, 50.0),  # at the limit: until 90 leaves the window
        ((10.0, 90.0, 95.0, 99.0), 100.0, 50.0),  # 10 is outside the window already
        ((30.0, 50.0, 80.0, 90.0), 100.0, 10.0),  # the third most recent (50) decides
        ((41.0, 42.0, 43.0), 100.0, 1.0),  # one second left
        ((39.0, 40.0, 41.0), 100.0, None),  # all but one have left the window
        ((40.0, 41.0, 42.0), 100.0, None),  # exactly on the edge: 40 has just left it
    ],
)
def test_locked_for(failures: tuple[float, ...], now: float, expected: float | None) -> None:
    got = locked_for(failures, now, POLICY)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),  # one host holds a whole /64
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),  # the next /64 is someone else
        ("::ffff:198.51.100.4", "198.51.100.4"),  # an IPv4 client of a dual-stack socket
        (None, "-"),
        ("", "-"),
        ("testclient", "testclient"),  # not an address: its own bucket
    ],
)
def test_client_key(host: str | None, key: str) -> None:
    assert client_key(host) == key
