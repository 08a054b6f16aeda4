"""Following a task's progress as it happens: ``for event in reach.stream(task_id)``.

The hub sends server-sent events (``GET /v1/tasks/{id}/stream``): the task's ``state``
first, then ``status`` changes, ``progress`` reports and the ``result``, each with an
id. A dropped connection is reopened with ``Last-Event-ID``, so the iterator yields
every event once and in order, and ends after the final one. The same iterator follows
a DAG run (``/api/v1/dag-runs/{id}/stream``: ``node`` events, then ``run``) or a
broadcast (``/v1/broadcasts/{id}/stream``: ``answer`` events, then ``complete``) with
`stream_path`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import requests

from reach.errors import HubUnavailable, ProtocolError, ResultTimeout, error_for_problem
from reach.sdk.hub_client import auth_headers, default_hub_url, redact, resolve_api_key

__all__ = ["StreamEvent", "parse_sse", "stream", "stream_path"]

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


def parse_sse(chunks: Iterable[bytes | str]) -> Iterator[tuple[str, str, str | None]]:
    """``(event, data, id)`` of each event in an SSE byte stream (comments, pings and
    ``retry:`` are skipped; a trailing event without its blank line is not yielded)."""
    buffer = ""
    event, event_id = "", None
    data: list[str] = []
    for chunk in chunks:
        buffer += chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
        while True:
            cut = min((i for i in (buffer.find("\r"), buffer.find("\n")) if i >= 0), default=-1)
            if cut < 0:
                break
            if buffer[cut] == "\r" and cut + 1 == len(buffer):
                break  # a \r at the end: its \n may be in the next chunk
            line = buffer[:cut]
            step = 2 if buffer.startswith("\r\n", cut) else 1
            buffer = buffer[cut + step :]
            if not line:
                if data or event:
                    yield event or "message", "\n".join(data), event_id
                event, data = "", []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id" and "\0" not in value:
                event_id = value


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
    base = (hub or default_hub_url()).rstrip("/")
    key = resolve_api_key(api_key)
    deadline = None if timeout is None else time.monotonic() + timeout
    last = last_event_id
    pause, failures = 0.2, 0
    with requests.Session() as http:
        while True:
            headers = {"Accept": "text/event-stream", **auth_headers(key)}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            read = _READ_TIMEOUT_S
            if deadline is not None:
                read = max(0.1, min(read, deadline - time.monotonic()))
            try:
                with http.get(
                    base + path, headers=headers, stream=True, timeout=(3.0, read)
                ) as resp:
                    if resp.status_code >= 400:
                        try:
                            problem = resp.json()
                        except ValueError:
                            problem = {}
                        raise error_for_problem(
                            problem if isinstance(problem, dict) else {}, resp.status_code
                        )
                    for kind, data, event_id in parse_sse(resp.iter_content(chunk_size=None)):
                        event = StreamEvent(kind, _json(data), _int(event_id))
                        if event.id is not None:
                            last = event.id
                        pause, failures = 0.2, 0
                        yield event
                        if event.final:
                            return
            except requests.RequestException as exc:
                failures += 1
                if deadline is not None and time.monotonic() >= deadline:
                    raise ResultTimeout(f"no final event from {path} within {timeout}s") from None
                if deadline is None and failures >= MAX_FAILURES:
                    detail = redact(str(exc), key)
                    raise HubUnavailable(f"hub at {base} is unreachable: {detail}") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"no final event from {path} within {timeout}s")
            time.sleep(pause)  # dropped (or closed early): resume after the last id
            pause = min(pause * 2, 5.0)


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"a stream event's data is not JSON: {data[:200]!r}") from exc


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
