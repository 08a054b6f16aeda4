"""HTTP client for the hub, used by the SDK and the CLI.

The edge where foreign exceptions stop: ``requests`` failures become ``HubUnavailable``,
problem documents become the typed ``ReachError`` the hub raised, and a success status
without the JSON object the API promises (a proxy's HTML page, a wrong URL, a truncated
answer) is a ``ProtocolError`` -- never a ``KeyError`` in the caller.

The caller's functions (``send``, ``wait_for_result`` ...) share one pooled session per
process and hub (`shared_session`): a TCP (and TLS) handshake per call would cost more
than most calls. An ``Agent`` keeps a session of its own for heartbeats, so business
traffic can never hold up the signal that the process is alive.

Credentials go per request (``Authorization: Bearer <key>``), never on a session: one
process may call one hub with several keys over the same pooled connections. The key is
kept out of reprs, logs and error details (a detail that echoes it is scrubbed).

The asyncio client (``reach.sdk.aio_client``) stops foreign exceptions at the same edge:
both hand what came back to `answer` (or what failed to `unavailable`), so a refusal or a
malformed answer is the same typed error whichever client met it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from reach.errors import (
    ConfigError,
    Forbidden,
    HubUnavailable,
    ProtocolError,
    ReachError,
    SecurityError,
    Unauthenticated,
    error_for_problem,
)

DEFAULT_HUB_URL = "http://127.0.0.1:8800"
API_KEY_ENV = "REACH_API_KEY"


def default_hub_url() -> str:
    """Inside a handler, its agent's hub; else ``$REACH_HUB_URL``; else 127.0.0.1:8800."""
    from reach.sdk import trace

    return (trace.hub_of_current() or os.environ.get("REACH_HUB_URL") or DEFAULT_HUB_URL).rstrip(
        "/"
    )


def default_api_key() -> str | None:
    """Inside a handler, its agent's key; else ``$REACH_API_KEY``; else none."""
    from reach.sdk import trace

    return trace.api_key_of_current() or os.environ.get(API_KEY_ENV) or None


def resolve_api_key(api_key: str | None) -> str | None:
    """The key a client sends: ``api_key``, or `default_api_key` when it is None; ``""``
    means none at all. Surrounding whitespace (a newline from a file) is dropped; a key
    with whitespace or control characters inside is refused without echoing it."""
    key = default_api_key() if api_key is None else api_key
    key = (key or "").strip()
    if not key:
        return None
    if not all("!" <= ch <= "~" for ch in key):
        raise ConfigError(
            f"api_key (or ${API_KEY_ENV}) is not a valid API key: it holds whitespace, "
            "control or non-ASCII characters (expected rk_<id>_<secret>)"
        )
    return key


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers that carry a resolved key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def redact(text: str, api_key: str | None) -> str:
    """``text`` with the key replaced by its public part (``rk_<id>_…``)."""
    if not api_key or api_key not in text:
        return text
    key_id, _, rest = api_key.removeprefix("rk_").partition("_")
    shown = f"rk_{key_id}_…" if rest and api_key.startswith("rk_") else "<api key>"
    return text.replace(api_key, shown)


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
    (`shared_session`); otherwise the client owns a session, closed by `close`.

    ``api_key``: sent with every request; None takes `default_api_key`, ``""`` sends none.
    """

    def __init__(
        self,
        hub: str | None = None,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        shared: bool = False,
        api_key: str | None = None,
    ) -> None:
        self.base_url = (hub or default_hub_url()).rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self.shared = shared
        self._api_key = resolve_api_key(api_key)
        self._headers = auth_headers(self._api_key)
        self._http = shared_session(self.base_url) if shared else requests.Session()

    @property
    def authenticated(self) -> bool:
        """Whether this client sends an API key."""
        return self._api_key is not None

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"HubClient({self.base_url!r}, api_key={key}, shared={self.shared})"

    def close(self) -> None:
        if not self.shared:  # the pooled session outlives its clients
            self._http.close()

    def post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        keys: tuple[str, ...] = (),
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` (with ``headers`` beside the key's); the answer must be a JSON
        object holding ``keys``."""
        if headers:
            return self._request("POST", path, keys, json=body, headers=headers)
        return self._request("POST", path, keys, json=body)

    def get(
        self, path: str, params: dict[str, Any] | None = None, *, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """GET ``path``; the answer must be a JSON object holding ``keys``."""
        return self._request("GET", path, keys, params=params)

    def put(self, path: str, body: dict[str, Any], *, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """PUT ``body`` (the admin API sets a value this way); as `post` otherwise."""
        return self._request("PUT", path, keys, json=body)

    def delete(
        self, path: str, body: dict[str, Any] | None = None, *, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """DELETE ``path`` (with a JSON ``body`` naming what to remove, if given)."""
        return self._request("DELETE", path, keys, json=body)

    def post_with_headers(
        self, path: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """As `post`, with the answer's headers (a heartbeat's names closed sessions)."""
        return self._exchange("POST", path, (), json=body)

    def _request(
        self, method: str, path: str, keys: tuple[str, ...], **kwargs: Any
    ) -> dict[str, Any]:
        return self._exchange(method, path, keys, **kwargs)[0]

    def _exchange(
        self, method: str, path: str, keys: tuple[str, ...], **kwargs: Any
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        url = self.base_url + path
        extra = kwargs.pop("headers", None)
        headers = {**self._headers, **extra} if extra else self._headers
        try:
            resp = self._http.request(method, url, timeout=self.timeout, headers=headers, **kwargs)
        except requests.RequestException as exc:
            error, cause = unavailable(
                self.base_url,
                exc,
                timed_out=isinstance(exc, requests.Timeout),
                api_key=self._api_key,
            )
            raise error from cause
        data = answer(
            resp.status_code,
            resp.headers.get("Content-Type"),
            resp.content,
            keys,
            f"{method} {self.base_url}{path}",
            self._api_key,
        )
        return data, resp.headers


# -- the edge, shared with the asyncio client (reach.sdk.aio_client): pure, no I/O -----------
def unavailable(
    base_url: str, exc: BaseException, *, timed_out: bool, api_key: str | None
) -> tuple[HubUnavailable, BaseException | None]:
    """The `HubUnavailable` a failed exchange raises, and the cause to chain to it: none
    when the cause's text holds the key (a traceback would show it)."""
    text = str(exc) or type(exc).__name__  # a bare timeout has no text
    detail = redact(text, api_key)
    what = "did not answer in time" if timed_out else "is unreachable"
    error = HubUnavailable(f"hub at {base_url} {what}: {detail}")
    return error, (exc if detail == text else None)


def answer(
    status: int,
    content_type: str | None,
    body: bytes,
    keys: tuple[str, ...],
    what: str,
    api_key: str | None,
) -> dict[str, Any]:
    """The JSON object of a success answer holding ``keys``; else raise the typed error:
    the hub's refusal (`refused`), or `ProtocolError` saying what came instead."""
    if status >= 400:
        raise refused(status, body, api_key)
    return _expected(status, content_type, body, keys, what)


def refused(status: int, body: bytes, api_key: str | None) -> ReachError:
    """The typed error of a refusal (status >= 400): its problem document, key scrubbed."""
    problem = _scrubbed(_json_or_empty(status, body), api_key)
    return _refusal(error_for_problem(problem, status), status)


def _refusal(error: ReachError, status: int) -> ReachError:
    """A 401/403 is a security error even when a proxy, not the hub, said it."""
    if isinstance(error, SecurityError) or status not in (401, 403):
        return error
    cls = Unauthenticated if status == 401 else Forbidden
    return cls(error.detail, **{k: v for k, v in error.extra.items() if k != "status"})


def _scrubbed(value: Any, api_key: str | None) -> Any:
    """A problem document with the key taken out of every string in it."""
    if not api_key:
        return value
    if isinstance(value, str):
        return redact(value, api_key)
    if isinstance(value, dict):
        return {k: _scrubbed(v, api_key) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, api_key) for v in value]
    return value


def _expected(
    status: int, content_type: str | None, body: bytes, keys: tuple[str, ...], what: str
) -> dict[str, Any]:
    """The JSON object of a success answer, or `ProtocolError` saying what came instead."""
    kind = content_type or "no content type"
    try:
        data = json.loads(body)
    except ValueError:
        raise ProtocolError(
            f"{what} answered {status} ({kind}) with a body that is not JSON: "
            f"{_text(body)[:200]!r}",
            http_status=status,
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError(
            f"{what} answered {status} with JSON {type(data).__name__}, not an object",
            http_status=status,
        )
    missing = [k for k in keys if k not in data]
    if missing:
        raise ProtocolError(
            f"{what} answered {status} without {', '.join(missing)}",
            http_status=status,
            missing=missing,
        )
    return data


def _json_or_empty(status: int, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {"detail": _text(body)[:500] or f"HTTP {status}"}
    return data if isinstance(data, dict) else {"value": data}


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace")
