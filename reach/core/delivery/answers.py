"""An agent's answer to one exchange, as the hub's transports hand it on: the HTTP
status and parsed body, or why there was none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 2000


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    status: int | None  # None: no HTTP answer at all
    body: Any
    error: str | None = None
    refused: bool = False  # mTLS would not (or could not safely) reach it: terminal

    @property
    def error_kind(self) -> str:
        """``timeout`` / ``unreachable`` / ``http`` / ``tls`` — for the caller's typed error."""
        if self.refused:
            return "tls"
        if self.status is not None:
            return "http"
        return "timeout" if self.error and "timed out" in self.error else "unreachable"


def declared_message(body: Any) -> str | None:
    """The error message an agent *declared*: the ``message`` string of a JSON object
    it answered with (its envelope), or None."""
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message[:MAX_MESSAGE]
    return None


def described_body(status: int | None, body: Any) -> str:
    """What a caller is told of an answer that declared no message: its shape, never its
    content. The hub may have been pointed at something that is not an agent at all (an
    internal page behind a redirect, a metadata service), and its body is no business of
    whoever reads the task's error."""
    answered = f"HTTP {status}" if status is not None else "no HTTP status"
    if body is None:
        return f"the agent answered {answered} with no body the hub could read"
    if isinstance(body, str):
        return f"the agent answered {answered} with a non-JSON body ({len(body)} characters)"
    kind = type(body).__name__ if not isinstance(body, dict) else "JSON object"
    return f"the agent answered {answered} with a {kind} that is not a Reach envelope"
