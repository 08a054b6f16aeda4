"""The agent's side of the channel: a WebSocket it opens to the hub, for when the hub cannot
open a connection to it (NAT, a home network, a locked-down container platform).

``reach.Agent(..., channel=True)`` (or an agent with no ``addr``) serves through this
instead of an HTTP server. One thread holds the socket: it registers (``hello``), answers
the hub's pings, sends heartbeats at the agent's interval, and hands each ``deliver`` frame
to a pool that runs it exactly as the HTTP server would (reach token checked by
``Agent.admit``, then ``Agent.invoke`` with its dedup guard and concurrency bound), after an
``ack``. The ``result`` goes back on the socket that brought the delivery; if that socket
died meanwhile the answer is dropped: the hub retries the attempt, and the dedup guard
answers the retry from the first run instead of running the handler again.

A lost socket is redialled after a jittered, doubling pause (0.2 s up to 10 s), so a
fleet whose hub restarts does not come back in one wave. Frames are JSON
(``reach.core.interop.channel``); the WebSocket's own pings keep idle NAT mappings alive.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from reach.core.interop.channel import FROM_HUB, MAX_FRAME_BYTES, FrameError, encode, parse
from reach.errors import (
    Forbidden,
    HubUnavailable,
    InvalidRegistration,
    ReachError,
    Unauthenticated,
)

if TYPE_CHECKING:
    from reach.sdk.agent import Agent

log = logging.getLogger("reach.sdk.channel")

PATH = "/v1/agents/channel"
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 10.0
KEEPALIVE_S = 15.0  # the WebSocket's own ping: keeps NAT mappings open while idle
_UNAUTHENTICATED = frozenset(
    {"missing", "malformed", "unknown_key", "wrong_secret", "expired", "revoked"}
)


def channel_url(hub: str) -> str:
    if hub.startswith("https://"):
        return "wss://" + hub[len("https://") :] + PATH
    if hub.startswith("http://"):
        return "ws://" + hub[len("http://") :] + PATH
    return hub + PATH


def refusal_error(code: str, message: str) -> ReachError:
    """The typed error of a hub's ``error`` frame that ends the channel."""
    if code in _UNAUTHENTICATED:
        return Unauthenticated(message)
    if code in ("forbidden", "wrong_agent"):
        return Forbidden(message)
    if code in ("invalid_registration", "invalid-request", "bad_frame"):
        return InvalidRegistration(message)
    return ReachError(f"{code}: {message}")


class AgentChannel:
    """The socket of one agent instance, redialled until `stop`."""

    def __init__(self, agent: Agent, hub_url: str, api_key: str | None) -> None:
        self.agent = agent
        self.url = channel_url(hub_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first = threading.Event()
        self._first_error: ReachError | None = None
        self._conn: ClientConnection | None = None
        self._send_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=agent.declaration.max_concurrency * 2 + 2,
            thread_name_prefix=f"reach-channel-{agent.agent_id}",
        )
        self.connects = 0  # sockets opened and welcomed (tests and logs)
        self.rng = random.Random()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, wait: float = 10.0) -> None:
        """Dial and register; raises at once if the hub refuses this agent's key or
        declaration (a hub that is down is redialled in the background)."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"reach-channel-{self.agent.agent_id}", daemon=True
        )
        self._thread.start()
        self._first.wait(wait)
        if self._first_error is not None:
            self.stop()
            raise self._first_error

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a socket that already broke
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def connected(self) -> bool:
        return self._conn is not None

    # -- the socket --------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._session()
                failures = 0
            except _Refused as exc:
                if not self._first.is_set():
                    self._first_error = exc.error
                    self._first.set()
                    return
                log.error("hub refused the channel of %s: %s", self.agent.agent_id, exc.error)
            except (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, TimeoutError) as exc:
                log.warning("channel of %s down: %s", self.agent.agent_id, exc)
            except Exception:
                log.exception("channel of %s failed", self.agent.agent_id)
            finally:
                self._conn = None
            if self._stop.is_set():
                return
            if not self._first.is_set() and failures == 0:
                self._first.set()  # the hub is down: start anyway, keep redialling
            failures += 1
            pause = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(failures, 10))
            self._stop.wait(self.rng.uniform(pause / 2, pause))

    def _session(self) -> None:
        """One socket, from dial to close."""
        with connect(
            self.url,
            additional_headers=self._headers,
            open_timeout=self.agent.hub.timeout[0] + self.agent.hub.timeout[1],
            ping_interval=KEEPALIVE_S,
            ping_timeout=KEEPALIVE_S,
            close_timeout=2,
            max_size=MAX_FRAME_BYTES,
            proxy=None,
            compression=None,
        ) as conn:
            declaration = self.agent.declaration.model_dump(mode="json")
            conn.send(encode("hello", register=declaration))
            first = self._receive(conn, timeout=15.0)
            if first is None or first.type == "error":
                data = first.data if first is not None else {}
                raise _Refused(
                    refusal_error(str(data.get("code", "closed")), str(data.get("message", "")))
                )
            if first.type != "welcome":
                raise _Refused(ReachError(f"expected welcome, got {first.type}"))
            self._conn = conn
            self.connects += 1
            self.agent._registered = True
            self._first.set()
            log.info("channel of %s/%s open", self.agent.agent_id, self.agent.instance_id)
            interval = self.agent.declaration.heartbeat_interval
            # the hub pings every ping_interval: silence for several is a dead link (a
            # broken route sends no FIN; TCP would take minutes to say so)
            ping_interval = first.data.get("ping_interval")
            silent_after = max(1.0, 4 * float(ping_interval or KEEPALIVE_S))
            heard = next_beat = time.monotonic()
            try:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if now - heard > silent_after:
                        raise TimeoutError(f"hub silent for {now - heard:.1f}s")
                    if now >= next_beat:
                        self._send(conn, encode("heartbeat", heartbeat=self._load()))
                        next_beat = now + interval
                    wait = min(next_beat, heard + silent_after) - time.monotonic()
                    frame = self._receive(conn, timeout=max(0.01, wait))
                    if frame is not None:
                        heard = time.monotonic()
                        self._handle(conn, frame)
            finally:
                self._conn = None  # answers of its deliveries are dropped from now on

    def _receive(self, conn: ClientConnection, timeout: float) -> Any:
        try:
            raw = conn.recv(timeout=timeout)
        except TimeoutError:
            return None
        try:
            return parse(raw, FROM_HUB)
        except FrameError as exc:
            log.error("hub sent a frame the SDK cannot read (%s): closing", exc.reason)
            conn.close(1008, exc.reason[:120])
            raise ConnectionClosed(None, None) from None

    def _handle(self, conn: ClientConnection, frame: Any) -> None:
        data: dict[str, Any] = frame.data
        if frame.type == "ping":
            self._send(conn, encode("pong", id=data.get("id")))
        elif frame.type == "deliver":
            task_id, seq = frame.attempt
            self._send(conn, encode("ack", task_id=task_id, attempt_seq=seq))
            self._pool.submit(self._run_delivery, conn, data)
        elif frame.type == "error":
            code, message = str(data.get("code")), str(data.get("message", ""))
            log.warning("hub refused a frame of %s: %s: %s", self.agent.agent_id, code, message)

    def _run_delivery(self, conn: ClientConnection, data: Mapping[str, Any]) -> None:
        task_id, seq = str(data["task_id"]), int(data["attempt_seq"])
        method = str(data["method"])
        authorization = data.get("authorization")
        try:
            # the body's bytes as the worker posted them: the token binds their digest
            raw = base64.b64decode(str(data["raw"]), validate=True)
            body = json.loads(raw)
        except ValueError:
            body = None
        try:
            if not isinstance(body, dict):
                status, reply = 400, {"code": 400, "message": "delivery body is not a JSON object"}
            else:
                refused = self.agent.admit(
                    body,
                    authorization if isinstance(authorization, str) else None,
                    method=method,
                    raw=raw,
                )
                status, reply = refused or self.agent.invoke(method, body)
        except Exception as exc:  # invoke answers handler failures itself; this is a bug
            log.exception("delivery of %s failed in the SDK", task_id)
            status, reply = 500, {"code": -1, "message": f"{type(exc).__name__}: {exc}"}
        if conn is not self._conn:
            log.info("channel changed while %s ran: its answer waits for the retry", task_id)
            return
        try:
            self._send(
                conn,
                json.dumps(
                    {
                        "type": "result",
                        "task_id": task_id,
                        "attempt_seq": seq,
                        "status": status,
                        "body": reply,
                    }
                ),
            )
        except (ConnectionClosed, OSError) as exc:
            log.info("answer of %s lost with its channel (%s): the hub retries", task_id, exc)

    def _send(self, conn: ClientConnection, text: str) -> None:
        with self._send_lock:
            conn.send(text)

    def _load(self) -> dict[str, Any]:
        return {**self.agent.runner.load(), "sent_at": time.time()}


class _Refused(Exception):
    def __init__(self, error: ReachError) -> None:
        super().__init__(str(error))
        self.error = error


__all__ = ["AgentChannel", "HubUnavailable", "channel_url", "refusal_error"]
