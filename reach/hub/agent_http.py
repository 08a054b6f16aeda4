"""HTTP from the hub to agents: one pooled session per worker process, separate timeouts.

Foreign exceptions stop here: the caller gets ``(status, body)`` or ``(None, error)``,
which ``reach.core.retry.classify`` turns into an outcome.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter

_CHUNK = 65_536
MAX_ANSWER_BYTES = 1_048_576  # as for payloads: larger results travel by reference


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
    def __init__(self, pool_size: int = 32, max_body_bytes: int = MAX_ANSWER_BYTES) -> None:
        self._local = threading.local()
        self._pool_size = pool_size
        self._max_body_bytes = max_body_bytes

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
        """POST one delivery; the whole exchange ends by ``connect + read`` seconds.

        ``requests``' read timeout bounds each socket read, not the answer: an agent that
        trickles a byte a second would outlive the attempt's lease and be delivered twice.
        So the body is read in chunks against one deadline, and its size is capped.
        """
        total = connect_timeout + read_timeout
        deadline = time.monotonic() + total
        try:
            resp = self._session().post(
                url,
                data=json.dumps(body),
                timeout=(connect_timeout, read_timeout),
                headers={"Content-Type": "application/json", **(headers or {})},
                stream=True,
            )
        except requests.Timeout as exc:
            return AgentAnswer(None, None, f"timed out: {exc}")
        except requests.RequestException as exc:
            return AgentAnswer(None, None, f"{type(exc).__name__}: {exc}")
        try:
            raw = _read_body(resp, deadline, self._max_body_bytes)
        except _AnswerTooSlow:
            resp.close()
            return AgentAnswer(None, None, f"timed out: no whole answer within {total:.1f}s")
        except _AnswerTooLarge:
            resp.close()
            # Not transient: the same agent would send the same answer again.
            return AgentAnswer(
                resp.status_code,
                None,
                f"answer larger than {self._max_body_bytes} bytes (send a reference instead)",
            )
        except (requests.RequestException, OSError, urllib3.exceptions.HTTPError) as exc:
            resp.close()
            if "timed out" in str(exc):
                return AgentAnswer(None, None, f"timed out: {exc}")
            return AgentAnswer(None, None, f"{type(exc).__name__}: {exc}")
        resp.raw.release_conn()  # read to the end: the connection goes back to the pool
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw[:2000].decode("utf-8", "replace")
        return AgentAnswer(resp.status_code, payload)


class _AnswerTooSlow(Exception):
    pass


class _AnswerTooLarge(Exception):
    pass


def _read_body(resp: requests.Response, deadline: float, limit: int) -> bytes:
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _AnswerTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _AnswerTooSlow
        _bound_next_read(resp, left)
        chunk = resp.raw.read1(_CHUNK, decode_content=True)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise _AnswerTooLarge
        chunks.append(chunk)


def _bound_next_read(resp: requests.Response, left: float) -> None:
    """Let the next socket read wait no longer than the time left (best effort: urllib3
    keeps the socket on its connection object)."""
    sock = getattr(getattr(resp.raw, "_connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(max(0.01, left))
