"""Blob links (``reach.core.blobs.links``): a link reads one blob until its expiry, and
nothing else -- another blob, a later expiry, another key or a changed signature fail."""

from __future__ import annotations

import pytest

from reach.core.blobs.links import expiry, is_blob_id, new_blob_id, query, refusal, sign

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
BLOB = "b-" + "0123456789abcdef" * 2
OTHER_BLOB = "b-" + "f" * 32
EXP = 1_000_300
SIG = sign(KEY, BLOB, EXP)


@pytest.mark.parametrize(
    ("blob_id", "exp", "sig", "now", "why"),
    [
        (BLOB, str(EXP), SIG, 1_000_000.0, None),  # fresh
        (BLOB, str(EXP), SIG, float(EXP), None),  # its last second
        (BLOB, str(EXP), SIG, EXP + 0.5, "expired"),
        (BLOB, str(EXP), SIG, 2_000_000.0, "expired"),
        (OTHER_BLOB, str(EXP), SIG, 1_000_000.0, "signature"),  # another blob's link
        (BLOB, str(EXP + 3600), SIG, 1_000_000.0, "signature"),  # stretched in time
        (BLOB, str(EXP), sign(OTHER_KEY, BLOB, EXP), 1_000_000.0, "signature"),  # not our key
        (BLOB, str(EXP), SIG[:-1] + ("A" if SIG[-1] != "A" else "B"), 1_000_000.0, "signature"),
        (BLOB, str(EXP), "", 1_000_000.0, "no exp or no sig"),
        (BLOB, None, SIG, 1_000_000.0, "no exp or no sig"),
        (BLOB, "soon", SIG, 1_000_000.0, "epoch seconds"),
        (BLOB, "-5", SIG, 1_000_000.0, "epoch seconds"),
        (BLOB, "1" * 40, SIG, 1_000_000.0, "epoch seconds"),
        (BLOB, str(EXP), "ünï", 1_000_000.0, "signature"),
    ],
)
def test_refusal(blob_id: str, exp: str | None, sig: str, now: float, why: str | None) -> None:
    got = refusal(KEY, blob_id, exp, sig, now)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got


def test_a_forged_expired_link_is_told_forged_not_expired() -> None:
    """The signature is checked first: only a link the hub signed is called expired."""
    got = refusal(KEY, BLOB, str(EXP), sign(OTHER_KEY, BLOB, EXP), EXP + 100.0)
    assert got is not None and "signature" in got


@pytest.mark.parametrize(
    ("now", "ttl", "expected"),
    [(1000.0, 300.0, 1300), (1000.2, 300.0, 1301), (1000.0, 0.5, 1001)],
)
def test_expiry_is_never_earlier_than_asked(now: float, ttl: float, expected: int) -> None:
    assert expiry(now, ttl) == expected


def test_query_carries_what_refusal_checks() -> None:
    params = dict(p.split("=", 1) for p in query(KEY, BLOB, EXP).split("&"))
    assert params == {"exp": str(EXP), "sig": SIG}
    assert refusal(KEY, BLOB, params["exp"], params["sig"], EXP - 1.0) is None


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (BLOB, True),
        ("b-" + "A" * 32, False),
        ("b-" + "0" * 31, False),
        ("../etc/passwd", False),
        ("b-" + "0" * 32 + "/x", False),
        ("b-" + "0" * 32 + "\n", False),
    ],
)
def test_blob_ids(value: str, ok: bool) -> None:
    assert is_blob_id(value) is ok


def test_new_blob_id_needs_32_hex_digits() -> None:
    assert new_blob_id("a" * 32) == "b-" + "a" * 32
    with pytest.raises(ValueError):
        new_blob_id("zz")
