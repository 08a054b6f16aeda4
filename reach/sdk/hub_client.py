"""HTTP client for the hub, used by the SDK and the CLI.

The edge where foreign exceptions stop: ``requests`` failures become ``HubUnavailable``,
problem documents become the typed ``ReachError`` the hub raised, and a success status
without the JSON object the API promises (a proxy's HTML page, a wrong URL, a truncated
answer) is a ``ProtocolError`` -- never a ``KeyError`` in the caller.

The caller's functions (``send``, ``wait_for_result`` ...) share one pooled session per
process and hub (`shared_session`): a TCP (and TLS) handshake per call would cost more
than most calls. An ``Agent`` keeps a session of its own for heartbeats, so business
traffic can never hold up the signal that the process is alive.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from reach.errors import HubUnavailable, ProtocolError, error_for_problem

DEFAULT_HUB_URL = "http://127.0.0.1:8800"


def default_hub_url() -> str:
    """Inside a handler, its agent's hub; else ``$REACH_HUB_URL``; else 127.0.0.1:8800."""
    from reach.sdk import trace

    return (trace.hub_of_current() or os.environ.get("REACH_HUB_URL") or DEFAULT_HUB_URL).rstrip(
        "/"
    )


# Connections kept per hub: as many as threads of one process usually call it at once.
POOL_SIZE = 32


class _Pools:
    """One ``requests.Session`` per hub URL, for this process only.

    A forked child must not use its parent's sockets (two processes reading one
    connection get each other's answers), so the sessions belong to the pid that made
    them and a child starts afresh; ``register_at_fork`` also gives the child a fresh
    lock, in case another thread of the parent held this one at the fork.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.sessions: dict[str, requests.Session] = {}

    def get(self, base_url: str) -> requests.Session:
        with self.lock:
            if self.pid != os.getpid():
                self._forget()
            session = self.sessions.get(base_url)
            if session is None:
                session = requests.Session()
                adapter = HTTPAdapter(pool_connections=1, pool_maxsize=POOL_SIZE)
                session.mount("http://", adapter)
                session.mount("https://", adapter)
                self.sessions[base_url] = session
            return session

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self._forget()

    def _forget(self) -> None:
        # Dropped, never used again: those connections are the parent's to read and close.
        self.sessions = {}
        self.pid = os.getpid()


_pools = _Pools()
os.register_at_fork(after_in_child=_pools.after_fork)


def shared_session(hub: str) -> requests.Session:
    """This process's pooled session for ``hub`` (thread-safe; a forked child gets its own)."""
    return _pools.get(hub.rstrip("/"))


class HubClient:
    """Calls to one hub. ``shared=True`` uses the process's pooled session for that hub
    (`shared_session`); otherwise the client owns a session, closed by `close`."""

    def __init__(
        self,
        hub: str | None = None,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        shared: bool = False,
    ) -> None:
        self.base_url = (hub or default_hub_url()).rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self.shared = shared
        self._http = shared_session(self.base_url) if shared else requests.Session()

    def close(self) -> None:
        if not self.shared:  # the pooled session outlives its clients
            self._http.close()

    def post(
        self, path: str, body: dict[str, Any], *, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """POST ``body``; the answer must be a JSON object holding ``keys``."""
        return self._request("POST", path, keys, json=body)

    def get(
        self, path: str, params: dict[str, Any] | None = None, *, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """GET ``path``; the answer must be a JSON object holding ``keys``."""
        return self._request("GET", path, keys, params=params)

    def _request(
        self, method: str, path: str, keys: tuple[str, ...], **kwargs: Any
    ) -> dict[str, Any]:
        url = self.base_url + path
        try:
            resp = self._http.request(method, url, timeout=self.timeout, **kwargs)
        except requests.Timeout as exc:
            raise HubUnavailable(f"hub at {self.base_url} did not answer in time: {exc}") from exc
        except requests.RequestException as exc:
            raise HubUnavailable(f"hub at {self.base_url} is unreachable: {exc}") from exc
        if resp.status_code >= 400:
            raise error_for_problem(_json_or_empty(resp), resp.status_code)
        return _expected(resp, keys, f"{method} {self.base_url}{path}")


def _expected(resp: requests.Response, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """The JSON object of a success answer, or `ProtocolError` saying what came instead."""
    kind = resp.headers.get("Content-Type") or "no content type"
    try:
        data = resp.json()
    except ValueError:
        raise ProtocolError(
            f"{what} answered {resp.status_code} ({kind}) with a body that is not JSON: "
            f"{resp.text[:200]!r}",
            http_status=resp.status_code,
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError(
            f"{what} answered {resp.status_code} with JSON {type(data).__name__}, not an object",
            http_status=resp.status_code,
        )
    missing = [k for k in keys if k not in data]
    if missing:
        raise ProtocolError(
            f"{what} answered {resp.status_code} without {', '.join(missing)}",
            http_status=resp.status_code,
            missing=missing,
        )
    return data


def _json_or_empty(resp: requests.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"detail": resp.text[:500] or f"HTTP {resp.status_code}"}
    return data if isinstance(data, dict) else {"value": data}
