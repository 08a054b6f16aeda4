"""Following a task's progress as it happens: ``for event in reach.stream(task_id)``.

The hub sends server-sent events (``GET /v1/tasks/{id}/stream``): the task's ``state``
first, then ``status`` changes, ``progress`` reports and the ``result``, each with an
id. A dropped connection is reopened with ``Last-Event-ID``, so the iterator yields
every event once and in order, and ends after the final one. The same iterator follows
a DAG run (``/api/v1/dag-runs/{id}/stream``: ``node`` events, then ``run``) or a
broadcast (``/v1/broadcasts/{id}/stream``: ``answer`` events, then ``complete``) with
`stream_path`. ``reach.aio.stream`` follows on asyncio the same way: `SSEParser` cuts the
bytes into events and `Resumption` decides when and from where to reopen, for both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import requests

from reach.errors import HubUnavailable, ProtocolError, ResultTimeout
from reach.sdk.hub_client import (
    auth_headers,
    default_hub_url,
    redact,
    refused,
    resolve_api_key,
)
from reach.wire.sse import SSEParser, parse_sse

__all__ = ["Resumption", "SSEParser", "StreamEvent", "parse_sse", "stream", "stream_path"]

FINAL_KINDS: Final = frozenset({"result", "complete", "run"})
_TERMINAL: Final = frozenset({"success", "failed", "dead", "cancelled"})
MAX_FAILURES = 8  # without a timeout: drops in a row (no event between) before giving up
_READ_TIMEOUT_S = 60.0  # the hub pings every 15 s by default: silence this long is a drop


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event: ``kind`` (state, status, progress, result; node, run; answer,
    complete), its JSON ``data`` and its ``id`` (resume after it)."""

    kind: str
    data: Any
    id: int | None

    @property
    def final(self) -> bool:
        """Whether the stream ends with this event (the hub closes it)."""
        if self.kind in FINAL_KINDS:
            return True
        if self.kind == "state" and isinstance(self.data, dict):
            return self.data.get("status") in _TERMINAL or self.data.get("complete") is True
        return False


class Resumption:
    """Where a followed stream stands between its connections: the last id seen, the
    pause before reopening, the drops in a row and the deadline. The sync and the asyncio
    iterators (``reach.aio.stream``) differ only in how they read; this decides the rest.
    """

    def __init__(
        self,
        base: str,
        path: str,
        api_key: str | None,
        timeout: float | None,
        last_event_id: int | None,
    ) -> None:
        self.base, self.path, self.api_key, self.timeout = base, path, api_key, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last = last_event_id
        self._pause, self._failures = 0.2, 0

    @property
    def url(self) -> str:
        return self.base + self.path

    def headers(self) -> dict[str, str]:
        """The next connection's headers: resume after the last event seen."""
        headers = {"Accept": "text/event-stream", **auth_headers(self.api_key)}
        if self.last is not None:
            headers["Last-Event-ID"] = str(self.last)
        return headers

    def read_timeout(self) -> float:
        """The longest silence on the next connection: a ping's absence, or the deadline."""
        if self.deadline is None:
            return _READ_TIMEOUT_S
        return max(0.1, min(_READ_TIMEOUT_S, self.deadline - time.monotonic()))

    def seen(self, kind: str, data: str, event_id: str | None) -> StreamEvent:
        """The event parsed from the wire, remembered as the place to resume after."""
        event = StreamEvent(kind, _json(data), _int(event_id))
        if event.id is not None:
            self.last = event.id
        self._pause, self._failures = 0.2, 0
        return event

    def dropped(self, detail: str) -> None:
        """The connection failed (``detail`` says how): raise when it is time to give up
        -- `ResultTimeout` past the deadline, else `HubUnavailable` after `MAX_FAILURES`
        drops in a row without a deadline; return to try again."""
        self._failures += 1
        if self._past_deadline():
            raise ResultTimeout(self._timed_out()) from None
        if self.deadline is None and self._failures >= MAX_FAILURES:
            detail = redact(detail, self.api_key)
            raise HubUnavailable(f"hub at {self.base} is unreachable: {detail}") from None

    def pause(self) -> float:
        """How long to wait before reopening (doubling up to 5 s); `ResultTimeout` past
        the deadline."""
        if self._past_deadline():
            raise ResultTimeout(self._timed_out())
        pause, self._pause = self._pause, min(self._pause * 2, 5.0)
        return pause

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _timed_out(self) -> str:
        return f"no final event from {self.path} within {self.timeout}s"


def stream(
    task_id: str,
    *,
    hub: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    last_event_id: int | None = None,
) -> Iterator[StreamEvent]:
    """The task's events until its result. ``timeout`` bounds the whole wait
    (`ResultTimeout` past it); a task the key may not read raises ``UnknownTask``."""
    return stream_path(
        f"/v1/tasks/{task_id}/stream",
        hub=hub,
        api_key=api_key,
        timeout=timeout,
        last_event_id=last_event_id,
    )


def stream_path(
    path: str,
    *,
    hub: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    last_event_id: int | None = None,
) -> Iterator[StreamEvent]:
    """Follow any of the hub's streams (see the module docstring), resuming on drops."""
    key = resolve_api_key(api_key)
    follow = Resumption((hub or default_hub_url()).rstrip("/"), path, key, timeout, last_event_id)
    with requests.Session() as http:
        while True:
            try:
                with http.get(
                    follow.url,
                    headers=follow.headers(),
                    stream=True,
                    timeout=(3.0, follow.read_timeout()),
                ) as resp:
                    if resp.status_code >= 400:
                        raise refused(resp.status_code, resp.content, key)
                    for kind, data, event_id in parse_sse(resp.iter_content(chunk_size=None)):
                        event = follow.seen(kind, data, event_id)
                        yield event
                        if event.final:
                            return
            except requests.RequestException as exc:
                follow.dropped(str(exc))
            time.sleep(follow.pause())  # dropped (or closed early): resume after the last id


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"a stream event's data is not JSON: {data[:200]!r}") from exc


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
