"""HTTP from the hub to agents: one pooled session per worker process, separate timeouts.

Foreign exceptions stop here: the caller gets ``(status, body)`` or ``(None, error)``,
which ``reach.core.retry.classify`` turns into an outcome.

L1 agents (mutual TLS) get sessions of their own, one per agent ID (a bounded LRU per
thread): each presents the hub's client certificate, trusts the hub CA only and asserts
the agent's identity name (``reach.core.trust.identity_name``) before any body is sent,
so a certificate of another agent, or of another CA, fails the handshake. An L1 target
the hub cannot reach that way (an ``http://`` endpoint, no hub certificates) is never
contacted; such answers are ``refused``, a terminal failure no retry would mend.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.ssl_match_hostname import CertificateError

from reach.core.trust import identity_name, mtls_refusal
from reach.hub.settings import Settings
from reach.sdk.stream import parse_sse

_CHUNK = 65_536
MAX_ANSWER_BYTES = 1_048_576  # as for payloads: larger results travel by reference
L1_SESSIONS = 64  # per thread: L1 agents a worker keeps connections to


@dataclass(frozen=True, slots=True)
class HubTls:
    """The hub's side of mutual TLS (``security.tls``, defaults under ``<home>/certs``)."""

    ca_cert: Path
    client_cert: Path
    client_key: Path
    ca_cert_set: bool = False  # security.tls.ca_cert was given: https to L2/L3 trusts it too

    @classmethod
    def from_settings(cls, settings: Settings) -> HubTls:
        tls = settings.security.tls
        certs = settings.storage.home_path / "certs"
        return cls(
            Path(tls.ca_cert) if tls.ca_cert else certs / "ca.pem",
            Path(tls.client_cert) if tls.client_cert else certs / "hub.pem",
            Path(tls.client_key) if tls.client_key else certs / "hub.key",
            ca_cert_set=bool(tls.ca_cert),
        )

    def missing(self) -> list[Path]:
        return [p for p in (self.ca_cert, self.client_cert, self.client_key) if not p.is_file()]


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


class AgentTransport:
    def __init__(
        self,
        pool_size: int = 32,
        max_body_bytes: int = MAX_ANSWER_BYTES,
        tls: HubTls | None = None,
    ) -> None:
        """``tls``: the hub's certificates, needed to reach L1 agents (None: none can be)."""
        self._local = threading.local()
        self._pool_size = pool_size
        self._max_body_bytes = max_body_bytes
        self._tls = tls

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
            if self._tls is not None and self._tls.ca_cert_set:
                session.verify = str(self._tls.ca_cert)
            self._local.session = session
        return session

    def _mtls_session(self, agent_id: str) -> requests.Session | str:
        """The L1 session for ``agent_id``, or why there can be none (no hub certs)."""
        sessions: OrderedDict[str, requests.Session] | None = getattr(self._local, "mtls", None)
        if sessions is None:
            sessions = self._local.mtls = OrderedDict()
        session = sessions.get(agent_id)
        if session is not None:
            sessions.move_to_end(agent_id)
            return session
        tls = self._tls
        missing = tls.missing() if tls is not None else []
        if tls is None or missing:
            named = ", ".join(str(p) for p in missing) or "no hub TLS configured"
            return (
                f"L1 agent requires https + mTLS, and the hub has no certificates for it "
                f"({named}): run `reach certs init` on the hub host, or set security.tls"
            )
        session = requests.Session()
        session.trust_env = False
        # requests would otherwise load its own CA bundle: only the hub CA vouches here
        session.verify = str(tls.ca_cert)
        session.cert = (str(tls.client_cert), str(tls.client_key))
        adapter = _PinnedAdapter(
            identity_name(agent_id), pool_connections=1, pool_maxsize=self._pool_size
        )
        session.mount("https://", adapter)
        sessions[agent_id] = session
        while len(sessions) > L1_SESSIONS:
            sessions.popitem(last=False)[1].close()
        return session

    def post(
        self,
        url: str,
        body: dict[str, Any],
        connect_timeout: float,
        read_timeout: float,
        headers: dict[str, str] | None = None,
        mtls_agent: str | None = None,
    ) -> AgentAnswer:
        """POST one delivery; the whole exchange ends by ``connect + read`` seconds.

        ``requests``' read timeout bounds each socket read, not the answer: an agent that
        trickles a byte a second would outlive the attempt's lease and be delivered twice.
        So the body is read in chunks against one deadline, and its size is capped.

        ``mtls_agent``: the target is this L1 agent; it is reached over mutual TLS with its
        identity asserted, or not at all (a ``refused`` answer).
        """
        session = self._session()
        if mtls_agent is not None:
            refusal = mtls_refusal(url)
            pinned = self._mtls_session(mtls_agent) if refusal is None else refusal
            if isinstance(pinned, str):
                return AgentAnswer(None, None, pinned, refused=True)
            session = pinned
        total = connect_timeout + read_timeout
        deadline = time.monotonic() + total
        try:
            resp = session.post(
                url,
                data=json.dumps(body),
                timeout=(connect_timeout, read_timeout),
                headers={"Content-Type": "application/json", **(headers or {})},
                stream=True,
            )
        except requests.Timeout as exc:
            return AgentAnswer(None, None, f"timed out: {exc}")
        except requests.RequestException as exc:
            if mtls_agent is not None and _verification_failed(exc):
                # the agent's certificate is not the hub CA's for this agent: nothing was sent
                return AgentAnswer(
                    None,
                    None,
                    f"L1 agent {mtls_agent} failed mTLS verification (its certificate is not "
                    f"one the hub CA issued for it): {exc}",
                    refused=True,
                )
            return AgentAnswer(None, None, f"{type(exc).__name__}: {exc}")
        return self._answer(resp, deadline, total)

    def _answer(self, resp: requests.Response, deadline: float, total: float) -> AgentAnswer:
        """Read a whole answer against the attempt's deadline and the size cap."""
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

    def post_events(
        self,
        url: str,
        body: dict[str, Any],
        connect_timeout: float,
        read_timeout: float,
        on_event: Callable[[str], bool],
        headers: dict[str, str] | None = None,
    ) -> AgentAnswer:
        """POST and read the answer as server-sent events, each event's data handed to
        ``on_event`` as it arrives (it returns True to stop reading); one deadline of
        ``connect + read`` seconds for the whole stream, as for `post`.

        An answer that is not an event stream is read and returned as `post` would. A
        stream that ends (or breaks, or runs out of time) answers ``AgentAnswer(200,
        None)`` with ``error`` saying why it stopped early, if it did."""
        session = self._session()
        total = connect_timeout + read_timeout
        deadline = time.monotonic() + total
        try:
            resp = session.post(
                url,
                data=json.dumps(body),
                timeout=(connect_timeout, read_timeout),
                headers={
                    "Content-Type": "application/json",
                    "Accept": "text/event-stream",
                    **(headers or {}),
                },
                stream=True,
            )
        except requests.Timeout as exc:
            return AgentAnswer(None, None, f"timed out: {exc}")
        except requests.RequestException as exc:
            return AgentAnswer(None, None, f"{type(exc).__name__}: {exc}")
        if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return self._answer(resp, deadline, total)
        try:
            for _kind, data, _id in parse_sse(_event_chunks(resp, deadline, self._max_body_bytes)):
                if on_event(data):
                    return AgentAnswer(200, None)
            return AgentAnswer(200, None)
        except _AnswerTooSlow:
            return AgentAnswer(200, None, f"timed out: the stream outlived {total:.1f}s")
        except _AnswerTooLarge:
            return AgentAnswer(200, None, f"an event larger than {self._max_body_bytes} bytes")
        except (requests.RequestException, OSError, urllib3.exceptions.HTTPError) as exc:
            return AgentAnswer(200, None, f"the stream broke: {type(exc).__name__}: {exc}")
        finally:
            resp.close()


def _chunks(resp: requests.Response, deadline: float) -> Iterator[bytes]:
    """The body's chunks as they come, each read bounded by the time left."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _AnswerTooSlow
        _bound_next_read(resp, left)
        chunk = resp.raw.read1(_CHUNK, decode_content=True)
        if not chunk:
            return
        yield chunk


def _event_chunks(resp: requests.Response, deadline: float, limit: int) -> Iterator[bytes]:
    """`_chunks` of an event stream, where no event (the text since the last chunk
    boundary) may grow past ``limit``."""
    pending = 0
    for chunk in _chunks(resp, deadline):
        pending = 0 if b"\n\n" in chunk else pending + len(chunk)
        if pending > limit:
            raise _AnswerTooLarge
        yield chunk


class _PinnedAdapter(HTTPAdapter):
    """Connections that accept only a certificate carrying ``identity`` (whatever the URL's
    host), checked by urllib3 after the handshake and before the request is written."""

    def __init__(self, identity: str, **kwargs: Any) -> None:
        self._identity = identity  # before super().__init__: it builds the pool manager
        super().__init__(max_retries=0, **kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["assert_hostname"] = self._identity
        super().init_poolmanager(*args, **kwargs)


def _verification_failed(exc: BaseException) -> bool:
    """True if the chain under ``exc`` holds a certificate verification failure (chain or
    identity), as opposed to a connection that merely broke during the handshake."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLCertVerificationError | CertificateError):
            return True
        todo.extend((*item.args, getattr(item, "reason", None), item.__cause__, item.__context__))
    return False


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
    for chunk in _chunks(resp, deadline):
        size += len(chunk)
        if size > limit:
            raise _AnswerTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _bound_next_read(resp: requests.Response, left: float) -> None:
    """Let the next socket read wait no longer than the time left (best effort: urllib3
    keeps the socket on its connection object)."""
    sock = getattr(getattr(resp.raw, "_connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(max(0.01, left))
