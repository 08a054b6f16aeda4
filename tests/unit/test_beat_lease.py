"""Tables for the single-holder lease that keeps one beat active, and its settings."""

from __future__ import annotations

import pytest

from reach.core.ops.lease import Lease, Outcome, claim, release
from reach.errors import ConfigError
from reach.hub.settings import load_settings
from reach.worker.beat_lock import CONFIG_KEY, BeatLockConfig
from reach.worker.factory import BEAT_SCHEDULER, celery_config

NOW = 1_000.0


@pytest.mark.parametrize(
    ("current", "me", "outcome", "holder_after", "expires_after", "previous"),
    [
        # nobody ever held it (no row yet) / released: the first contender takes it
        (None, "a", Outcome.ACQUIRED, "a", NOW + 15, None),
        (Lease(None, NOW + 5), "a", Outcome.ACQUIRED, "a", NOW + 15, None),
        # another holds it: stand by, nothing changes
        (Lease("b", NOW + 0.001), "a", Outcome.STANDBY, "b", NOW + 0.001, "b"),
        (Lease("b", NOW + 15), "a", Outcome.STANDBY, "b", NOW + 15, "b"),
        # another's lease lapsed (it died): take over; lapsed exactly now counts as lapsed
        (Lease("b", NOW), "a", Outcome.ACQUIRED, "a", NOW + 15, "b"),
        (Lease("b", NOW - 60), "a", Outcome.ACQUIRED, "a", NOW + 15, "b"),
        # our own live lease: renewed from now, not from its old expiry
        (Lease("a", NOW + 1), "a", Outcome.RENEWED, "a", NOW + 15, "a"),
        (Lease("a", NOW + 14.5), "a", Outcome.RENEWED, "a", NOW + 15, "a"),
        # our own lapsed lease: acquired anew (we may have stopped acting meanwhile)
        (Lease("a", NOW - 1), "a", Outcome.ACQUIRED, "a", NOW + 15, "a"),
    ],
)
def test_claim(
    current: Lease | None,
    me: str,
    outcome: Outcome,
    holder_after: str,
    expires_after: float,
    previous: str | None,
) -> None:
    decision = claim(current, me, NOW, duration=15)
    assert decision.outcome is outcome
    assert decision.ours is (outcome is not Outcome.STANDBY)
    assert decision.lease == Lease(holder_after, expires_after)
    assert decision.previous == previous


@pytest.mark.parametrize("duration", [0.0, -1.0])
def test_a_lease_lasts_a_positive_time(duration: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        claim(None, "a", NOW, duration)


@pytest.mark.parametrize(
    ("current", "after"),
    [
        (None, None),  # nothing to release
        (Lease("b", NOW + 10), None),  # not ours: left alone
        (Lease(None, NOW - 1), None),  # already free
        (Lease("a", NOW + 10), Lease(None, NOW)),  # ours: free at once
        (Lease("a", NOW - 3), Lease(None, NOW - 3)),  # ours and lapsed: stays lapsed
    ],
)
def test_release(current: Lease | None, after: Lease | None) -> None:
    released = release(current, "a", NOW)
    assert released == after
    if released is not None:  # a released lease is free for the next claim at once
        assert claim(released, "b", NOW, 15).outcome is Outcome.ACQUIRED


def test_two_contenders_never_both_hold_it() -> None:
    """Alternating claims over time: at every instant at most one holder, and the
    survivor takes over no later than one lease after the other's last renewal."""
    lease: Lease | None = None
    duration, poll = 3.0, 0.5
    holders = []
    for step in range(40):
        now = step * poll
        for me in ("a", "b") if step < 20 else ("b",):  # "a" dies at step 20
            decision = claim(lease, me, now, duration)
            if decision.ours:
                lease = decision.lease
            holders.append((now, me, decision.ours))
        owners_now = {me for t, me, ours in holders if t == now and ours}
        assert len(owners_now) <= 1
    assert holders[0] == (0.0, "a", True)
    took_over = min(t for t, me, ours in holders if me == "b" and ours)
    last_renewal_of_a = max(t for t, me, ours in holders if me == "a" and ours)
    assert took_over - last_renewal_of_a <= duration + poll


# -- settings --------------------------------------------------------------------------


def test_beat_lock_defaults_and_environment() -> None:
    beat = load_settings(environ={}).beat
    assert (beat.lock_lease_s, beat.lock_renew_s, beat.lock_poll_s) == (15.0, 5.0, 2.0)
    short = load_settings(
        environ={
            "REACH_BEAT__LOCK_LEASE_S": "3",
            "REACH_BEAT__LOCK_RENEW_S": "1",
            "REACH_BEAT__LOCK_POLL_S": "0.5",
        }
    ).beat
    assert (short.lock_lease_s, short.lock_renew_s, short.lock_poll_s) == (3.0, 1.0, 0.5)


@pytest.mark.parametrize(
    ("environ", "key", "message"),
    [
        ({"REACH_BEAT__LOCK_RENEW_S": "15"}, "REACH_BEAT__LOCK_RENEW_S", "shorter than"),
        ({"REACH_BEAT__LOCK_LEASE_S": "0"}, "REACH_BEAT__LOCK_LEASE_S", "greater than"),
        ({"REACH_BEAT__LOCK_POLL_S": "-1"}, "REACH_BEAT__LOCK_POLL_S", "greater than"),
        ({"REACH_BEAT__LOCK_COLOUR": "red"}, "REACH_BEAT__LOCK_COLOUR", "Extra inputs"),
    ],
)
def test_bad_beat_lock_settings_are_named(environ: dict[str, str], key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings(environ=environ)
    assert caught.value.extra["key"] == key


def test_the_celery_app_uses_the_leased_scheduler() -> None:
    settings = load_settings(
        environ={"REACH_DATABASE_URL": "postgresql+psycopg://u:secret@db/reach"}
    )
    config = celery_config(settings)
    assert config["beat_scheduler"] == BEAT_SCHEDULER
    lock = config[CONFIG_KEY]
    assert lock == BeatLockConfig("postgresql+psycopg://u:secret@db/reach", 15.0, 5.0, 2.0)
    assert "secret" not in repr(lock)  # Celery's conf dumps print values with repr
