"""Waking long-polls the moment a task ends, instead of re-reading the store on a timer.

The process that makes a task terminal (a worker recording the agent's answer, the API
taking a late report) publishes its id on a Redis channel after the commit; the API holds
one subscriber and wakes the requests waiting on that id, which then read the store.
Pub/sub is lossy by design, so a waiter still re-reads on a slow timer: a lost
notification costs latency, never a result. Without Redis (the embedded default) there is
no channel and waiters re-read on the timer alone.

Progress streams also need the steps before the end: `mark_changed` announces that a
task has new events (a status change, a progress report) on a channel of its own, which
wakes only the streams' listeners (`Waiters.on_change`), never a long-poll waiting for
the end; a terminal notice wakes both. An API subscribes to the change channel only while
it streams something, and a publisher sends change notices only while the channel has a
subscriber (asked of Redis at most once per `CHANGE_LISTENERS_TTL_S`): a delivery nobody
streams costs no notice, no decode and no hop onto the API's event loop. A stream's feed
re-reads on a short timer until its API has been subscribed for that long
(`Waiters.changes_live`), so the notices a publisher skipped before it looked again cost
a few hundred milliseconds at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("reach.hub.ledger.wakeups")
_PENDING = "reach.finished"
_CHANGED = "reach.changed"


def channel_for(url: str) -> str:
    """One channel per Redis database: hubs sharing a server do not wake each other."""
    return "reach:done:" + url.rsplit("/", 1)[-1]


def changes_channel_for(url: str) -> str:
    """The change notices' channel (streams only), beside `channel_for`'s."""
    return "reach:changed:" + url.rsplit("/", 1)[-1]


CHANGE_LISTENERS_TTL_S = 1.0  # how long a publisher trusts its count of change listeners


MAX_CARRIED_BYTES = 65_536  # a larger final view is announced by id and read by the waiter


def mark_finished(session: Session, key: str, view: dict[str, Any] | None = None) -> None:
    """Announce ``key`` (with its final ``view``, if small) once the transaction commits."""
    session.info.setdefault(_PENDING, {})[key] = view


def mark_changed(session: Session, key: str) -> None:
    """Announce that ``key`` has new events once the transaction commits (streams wake)."""
    session.info.setdefault(_CHANGED, set()).add(key)


class CompletionBus:
    """The publishing side, used by every hub process."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.channel = channel_for(url) if url else ""
        self.changes_channel = changes_channel_for(url) if url else ""
        self._client: Any = None
        self._listeners_at = -CHANGE_LISTENERS_TTL_S  # monotonic time of the last count
        self._listeners = 0

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def attach(self, db: sessionmaker[Session]) -> None:
        """Publish what each committed transaction finished; forget it on rollback."""
        if not self.enabled:
            return
        event.listen(db, "after_commit", self._after_commit)
        event.listen(db, "after_soft_rollback", _forget)

    def _after_commit(self, session: Session) -> None:
        keys = session.info.pop(_PENDING, None)
        changed = session.info.pop(_CHANGED, None)
        if keys:
            self.notify(keys)
        if changed:
            self.notify_changed(k for k in changed if not keys or k not in keys)

    def _redis(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                str(self.url), socket_timeout=1, socket_connect_timeout=1
            )
        return self._client

    def _anyone_streams(self) -> bool:
        """Whether the change channel has a subscriber (counted at most once a TTL)."""
        now = time.monotonic()
        if now - self._listeners_at >= CHANGE_LISTENERS_TTL_S:
            counts = self._redis().pubsub_numsub(self.changes_channel)
            self._listeners = int(counts[0][1]) if counts else 0
            self._listeners_at = now
        return self._listeners > 0

    def notify_changed(self, keys: Iterable[str]) -> None:
        """Publish change notices (a terminal notice is one already: not repeated), only
        while an API streams something."""
        keys = list(keys)
        if not keys:
            return
        try:
            if not self._anyone_streams():
                return
            pipe = self._redis().pipeline(transaction=False)
            for key in keys:
                pipe.publish(self.changes_channel, json.dumps({"key": key, "change": True}))
            pipe.execute()
        except Exception as exc:  # streams fall back to re-reading; never fail a commit
            log.debug("change notice not sent: %s", exc)

    def notify(self, keys: Mapping[str, dict[str, Any] | None] | Iterable[str]) -> None:
        items = keys.items() if isinstance(keys, Mapping) else ((k, None) for k in keys)
        try:
            pipe = self._redis().pipeline(transaction=False)
            for key, view in items:
                pipe.publish(self.channel, _encode(key, view))
            pipe.execute()
        except Exception as exc:  # waiters fall back to re-reading; never fail a commit
            log.debug("completion notice not sent: %s", exc)


def _forget(session: Session, previous_transaction: Any) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_CHANGED, None)


def _encode(key: str, view: dict[str, Any] | None) -> str:
    if view is not None:
        body = json.dumps({"key": key, "view": view}, default=str)
        if len(body) <= MAX_CARRIED_BYTES:
            return body
    return json.dumps({"key": key})


def _decode(raw: bytes) -> tuple[str, dict[str, Any] | None]:
    message = json.loads(raw)
    return str(message["key"]), message.get("view")


def _decode_notice(raw: bytes) -> tuple[str, dict[str, Any] | None, bool]:
    """(key, carried view, whether it is only a change notice)."""
    message = json.loads(raw)
    return str(message["key"]), message.get("view"), message.get("change") is True


class Watch:
    """What a long-poll waits on: woken when a key is announced, with its view if carried."""

    def __init__(self) -> None:
        self.woken = asyncio.Event()
        self.view: dict[str, Any] | None = None
        self.seen: set[str] = set()  # distinct keys announced so far

    def wake(self, key: str, view: dict[str, Any] | None) -> None:
        self.seen.add(key)
        if view is not None:
            self.view = view
        self.woken.set()


class Waiters:
    """The listening side, in the API: long-polls watch keys, one thread subscribes."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Watch]] = {}
        self._on_change: dict[str, set[Callable[[str], None]]] = {}
        self._stop = threading.Event()
        self.live = False  # subscribed right now: waiters can afford a slow fallback timer
        self._changes_since: float | None = None  # monotonic: subscribed to change notices

    @property
    def changes_live(self) -> bool:
        """Subscribed to change notices for long enough that every publisher counts this
        API among the listeners (`CHANGE_LISTENERS_TTL_S`): streams may wait on them."""
        since = self._changes_since
        return (
            self.live
            and since is not None
            and time.monotonic() - since > (CHANGE_LISTENERS_TTL_S + 0.1)
        )

    @contextlib.contextmanager
    def watch(self, keys: Iterable[str]) -> Iterator[Watch]:
        """A watch woken when any of ``keys`` is announced (call on the event loop)."""
        watch = Watch()
        keys = list(keys)
        for key in keys:
            self._by_key.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            for key in keys:
                watchers = self._by_key.get(key)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._by_key[key]

    def wake(self, key: str, view: dict[str, Any] | None = None) -> None:
        for watch in list(self._by_key.get(key, ())):
            watch.wake(key, view)
        self.changed(key)

    @contextlib.contextmanager
    def on_change(self, keys: Iterable[str], listener: Callable[[str], None]) -> Iterator[None]:
        """Call ``listener(key)`` (on the event loop) whenever one of ``keys`` changes or
        ends: how a shared stream feed learns to read, once for all its streams."""
        keys = list(keys)
        for key in keys:
            self._on_change.setdefault(key, set()).add(listener)
        try:
            yield
        finally:
            for key in keys:
                listeners = self._on_change.get(key)
                if listeners is not None:
                    listeners.discard(listener)
                    if not listeners:
                        del self._on_change[key]

    def changed(self, key: str) -> None:
        for listener in list(self._on_change.get(key, ())):
            listener(key)

    def start(self, bus: CompletionBus, loop: asyncio.AbstractEventLoop) -> None:
        if not bus.enabled:
            return
        threading.Thread(
            target=self._listen, args=(bus, loop), name="reach-completions", daemon=True
        ).start()

    def stop(self) -> None:
        self._stop.set()

    def _listen(self, bus: CompletionBus, loop: asyncio.AbstractEventLoop) -> None:
        import redis

        while not self._stop.is_set():
            try:
                # Any: redis-py types PubSub differently from one release to the next
                client: Any = redis.Redis.from_url(str(bus.url), socket_connect_timeout=2)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(bus.channel)
                self.live = True
                changes = False  # subscribed to the change channel
                while not self._stop.is_set():
                    # the change channel only while something streams (read on this
                    # thread: a PubSub is not shared between threads)
                    if bool(self._on_change) != changes:
                        changes = not changes
                        if changes:
                            pubsub.subscribe(bus.changes_channel)
                            self._changes_since = time.monotonic()
                        else:
                            pubsub.unsubscribe(bus.changes_channel)
                            self._changes_since = None
                    message = pubsub.get_message(timeout=0.2 if changes else 0.5)
                    if message is not None and message.get("type") == "message":
                        try:
                            key, view, change = _decode_notice(message["data"])
                        except (ValueError, KeyError, TypeError, AttributeError):
                            continue
                        if change:
                            loop.call_soon_threadsafe(self.changed, key)
                        else:
                            loop.call_soon_threadsafe(self.wake, key, view)
                pubsub.close()
                client.close()
            except Exception as exc:
                self.live = False
                log.warning("completion channel lost, long-polls re-read on a timer: %s", exc)
                self._stop.wait(1.0)
            finally:
                self.live = False
                self._changes_since = None
