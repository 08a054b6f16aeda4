"""An agent's answer to one exchange, as the hub's transports hand it on: the HTTP
status and parsed body, or why there was none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
