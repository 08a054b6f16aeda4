"""HTTP from the hub to agents: one pooled session per worker process, separate timeouts.

Foreign exceptions stop here: the caller gets ``(status, body)`` or ``(None, error)``,
which ``reach.core.retry.classify`` turns into an outcome.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    status: int | None  # None: no HTTP answer at all
    body: Any
    error: str | None = None

    @property
    def error_kind(self) -> str:
        """``timeout`` / ``unreachable`` / ``http`` — for the typed error a caller sees."""
        if self.status is not None:
            return "http"
        return "timeout" if self.error and "timed out" in self.error else "unreachable"


class AgentTransport:
    def __init__(self, pool_size: int = 32) -> None:
        self._local = threading.local()
        self._pool_size = pool_size

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Agents are reached directly: looking up proxy settings in the environment
            # on every request was a fifth of a delivery's CPU.
            session.trust_env = False
            adapter = HTTPAdapter(
                pool_connections=self._pool_size, pool_maxsize=self._pool_size, max_retries=0
            )
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            self._local.session = session
        return session

    def post(
        self,
        url: str,
        body: dict[str, Any],
        connect_timeout: float,
        read_timeout: float,
        headers: dict[str, str] | None = None,
    ) -> AgentAnswer:
        try:
            resp = self._session().post(
                url,
                data=json.dumps(body),
                timeout=(connect_timeout, read_timeout),
                headers={"Content-Type": "application/json", **(headers or {})},
            )
        except requests.Timeout as exc:
            return AgentAnswer(None, None, f"timed out: {exc}")
        except requests.RequestException as exc:
            return AgentAnswer(None, None, f"{type(exc).__name__}: {exc}")
        try:
            payload: Any = resp.json()
        except ValueError:
            payload = resp.text[:2000]
        return AgentAnswer(resp.status_code, payload)
