"""The agent channel's frames: what may travel on ``/v1/agents/channel``, checked before use.

An agent the hub cannot dial holds a WebSocket to the hub instead; every message on it is
one JSON object with a ``type``. From the hub: ``welcome`` (the channel is registered),
``deliver`` (one attempt of a task: ``task_id``, ``attempt_seq``, ``method``, ``raw`` -- the
delivery body's exact bytes as the worker posted them, base64: the reach token binds their
digest -- and the reach token as ``authorization``), ``ping`` and ``error``. From the
agent: ``hello`` (the first frame: its declaration), ``ack`` (a delivery arrived),
``result`` (its answer: the ``status`` and ``body`` an HTTP agent would have answered),
``pong`` and ``heartbeat`` (its load, as the HTTP heartbeat carries it).

`parse` is the one gate: a frame that is not a JSON object of a known type with the fields
that type needs, or that is larger than allowed, is a `FrameError`; the hub then closes the
channel with the policy-violation code (1008), since a peer that speaks garbage once is
not to be trusted with the next delivery.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

POLICY_VIOLATION = 1008  # WebSocket close code: the peer broke the protocol
GOING_AWAY = 1001
MAX_FRAME_BYTES = 2 * 1_048_576  # a 1 MiB answer plus its envelope; larger goes by reference

FROM_AGENT = frozenset({"hello", "ack", "result", "pong", "heartbeat", "error"})
FROM_HUB = frozenset({"welcome", "deliver", "ping", "error"})
_ATTEMPT_FRAMES = frozenset({"ack", "result", "deliver"})


class FrameError(ValueError):
    """A frame refused: ``reason`` is safe to send back (it never echoes the frame)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Frame:
    type: str
    data: dict[str, Any]

    @property
    def attempt(self) -> tuple[str, int]:
        """(task_id, attempt_seq) of an ack, result or deliver frame."""
        return str(self.data["task_id"]), int(self.data["attempt_seq"])


def parse(raw: str | bytes, allowed: frozenset[str], max_bytes: int = MAX_FRAME_BYTES) -> Frame:
    """One received frame, checked; raises `FrameError` for anything else."""
    if len(raw) > max_bytes:
        raise FrameError(f"frame larger than {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise FrameError("frame is not JSON") from None
    if not isinstance(data, dict):
        raise FrameError("frame must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in allowed:
        raise FrameError(f"unknown frame type (expected one of {', '.join(sorted(allowed))})")
    if kind in _ATTEMPT_FRAMES:
        task_id, seq = data.get("task_id"), data.get("attempt_seq")
        if not isinstance(task_id, str) or not task_id or len(task_id) > 200:
            raise FrameError(f"{kind} frame needs task_id (a non-empty string)")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise FrameError(f"{kind} frame needs attempt_seq (a non-negative integer)")
    if kind == "result":
        status, body = data.get("status"), data.get("body")
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            raise FrameError("result frame needs status (an HTTP status, 100-599)")
        if not isinstance(body, dict):
            raise FrameError("result frame needs body (a JSON object)")
    if kind == "deliver" and (
        not isinstance(data.get("method"), str) or not isinstance(data.get("raw"), str)
    ):
        raise FrameError("deliver frame needs method (string) and raw (the body, base64)")
    if kind == "hello" and not isinstance(data.get("register"), dict):
        raise FrameError("hello frame needs register (the agent's declaration)")
    if kind == "pong" and not isinstance(data.get("id"), int):
        raise FrameError("pong frame needs id (the ping's id)")
    if kind == "heartbeat" and not isinstance(data.get("heartbeat"), dict):
        raise FrameError("heartbeat frame needs heartbeat (the agent's load)")
    return Frame(kind, data)


def encode(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}, default=str)


INTERNAL_PATH = "/internal/channel/"
_INTERNAL = INTERNAL_PATH


def shown_endpoint(endpoint: str) -> str:
    """What a view shows of an instance's endpoint: a channel instance's stored endpoint
    carries its socket's secret (``…/internal/channel/<iid>/<secret>``), which no reader
    of the fleet may learn; the replica and instance stay visible."""
    head, sep, tail = endpoint.partition(_INTERNAL)
    if not sep:
        return endpoint
    instance = tail.split("/", 1)[0]
    return f"{head}{_INTERNAL}{instance}/***"


_SECRET_IN_TEXT = re.compile(r"(/internal/channel/[^/\s'\"]+/)[^/\s'\"]+")


def redacted(text: str) -> str:
    """``text`` (an error message, a URL) with every channel socket secret in it masked, as
    ``shown_endpoint`` does: delivery errors quote the URL they failed on."""
    return _SECRET_IN_TEXT.sub(r"\1***", text)
