"""Completion notices on a real Redis: a commit that finishes a task wakes the waiting
long-poll with the final view; a rollback announces nothing; a large view is announced
by id only."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from reach.hub.ledger.wakeups import (
    CHANGE_LISTENERS_TTL_S,
    MAX_CARRIED_BYTES,
    CompletionBus,
    Waiters,
    changes_channel_for,
    channel_for,
    mark_finished,
)
from reach.hub.storage import session_factory

pytestmark = pytest.mark.redis


async def _wait_for(
    waiters: Waiters, key: str, act: Any, timeout: float = 5.0
) -> tuple[bool, dict[str, Any] | None]:
    deadline = time.monotonic() + 5
    while not waiters.live and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert waiters.live, "the listener never subscribed"
    with waiters.watch([key]) as watch:
        await asyncio.get_running_loop().run_in_executor(None, act)
        try:
            await asyncio.wait_for(watch.woken.wait(), timeout)
        except TimeoutError:
            return False, None
        return True, watch.view


def _listen(url: str, key: str, act: Any, timeout: float = 5.0) -> tuple[bool, Any]:
    async def main() -> tuple[bool, Any]:
        waiters = Waiters()
        waiters.start(CompletionBus(url), asyncio.get_running_loop())
        try:
            return await _wait_for(waiters, key, act, timeout)
        finally:
            waiters.stop()

    return asyncio.run(main())


@pytest.fixture
def db(engine: Engine, redis_db: str) -> sessionmaker[Session]:
    factory = session_factory(engine)
    CompletionBus(redis_db).attach(factory)
    return factory


def test_commit_wakes_the_waiter_with_the_view(db: sessionmaker[Session], redis_db: str) -> None:
    def finish() -> None:
        with db.begin() as s:
            s.execute(text("SELECT 1"))
            mark_finished(s, "t-1", {"task_id": "t-1", "status": "success", "result": 42})

    woken, view = _listen(redis_db, "t-1", finish)
    assert woken and view == {"task_id": "t-1", "status": "success", "result": 42}


def test_rollback_announces_nothing(db: sessionmaker[Session], redis_db: str) -> None:
    def fail() -> None:
        with pytest.raises(RuntimeError), db.begin() as s:
            mark_finished(s, "t-2", {"task_id": "t-2", "status": "success"})
            raise RuntimeError("the transaction fails")

    woken, _ = _listen(redis_db, "t-2", fail, timeout=1.0)
    assert not woken


def test_a_large_view_is_announced_by_id_only(redis_db: str) -> None:
    big = {"task_id": "t-3", "status": "success", "result": "x" * MAX_CARRIED_BYTES}
    woken, view = _listen(redis_db, "t-3", lambda: CompletionBus(redis_db).notify({"t-3": big}))
    assert woken and view is None  # the waiter reads the store instead


def test_other_keys_do_not_wake(redis_db: str) -> None:
    woken, _ = _listen(
        redis_db, "t-4", lambda: CompletionBus(redis_db).notify(["t-5"]), timeout=1.0
    )
    assert not woken


def test_without_redis_nothing_is_attached(engine: Engine) -> None:
    bus = CompletionBus(None)
    factory = session_factory(engine)
    bus.attach(factory)  # no channel: waiters fall back to re-reading the store
    with factory.begin() as s:
        mark_finished(s, "t-6", None)
    assert not bus.enabled


def _published_changes(url: str, act: Any, settle: float = 0.3) -> list[bytes]:
    """What this database's hub channels carry while ``act`` runs, seen by a pattern
    subscriber, which unlike a plain one does not count as a listener (NUMSUB). Channels
    are server-wide: ``reach:*`` would also catch the hubs of other xdist workers' tests,
    which use other databases of the same server."""
    import redis

    client: Any = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(channel_for(url), changes_channel_for(url))
    try:
        act()
        seen: list[bytes] = []
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.05)
            if message is not None and message.get("type") == "pmessage":
                seen.append(message["data"])
        return seen
    finally:
        pubsub.close()
        client.close()


def test_change_notices_are_not_sent_while_nothing_streams(redis_db: str) -> None:
    bus = CompletionBus(redis_db)
    assert _published_changes(redis_db, lambda: bus.notify_changed(["t-7"])) == []


def test_a_streaming_api_gets_change_notices_and_none_after(redis_db: str) -> None:
    """A stream's listener subscribes the API to the change channel; once publishers have
    counted it (`Waiters.changes_live`) every change notice reaches the listener. When
    the last stream ends the API leaves the channel and publishers stop sending."""
    bus = CompletionBus(redis_db)

    async def main() -> tuple[list[str], bool]:
        waiters = Waiters()
        waiters.start(CompletionBus(redis_db), asyncio.get_running_loop())
        seen: list[str] = []
        got = asyncio.Event()

        def listener(key: str) -> None:
            seen.append(key)
            got.set()

        try:
            with waiters.on_change(["t-8"], listener):
                deadline = time.monotonic() + 5
                while not waiters.changes_live and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert waiters.changes_live, "the listener never subscribed to changes"
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, bus.notify_changed, ["t-8", "t-9"])
                await asyncio.wait_for(got.wait(), 5)
            await asyncio.sleep(1.0)  # the listener thread leaves the change channel
            return seen, waiters.changes_live
        finally:
            waiters.stop()

    seen, still_live = asyncio.run(main())
    assert seen == ["t-8"] and not still_live  # only the watched key's listener ran
    time.sleep(CHANGE_LISTENERS_TTL_S)  # the publisher counts again: nobody listens
    assert _published_changes(redis_db, lambda: bus.notify_changed(["t-8"])) == []
