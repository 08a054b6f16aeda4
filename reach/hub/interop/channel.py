"""Agent channels held by this API process: deliveries over a WebSocket the agent opened.

An agent behind NAT cannot be dialled, so it dials the hub (``/v1/agents/channel``, see
``reach.hub.api.routes.channel``). The replica that accepts the socket registers the
instance with an endpoint *on itself*: ``http://<replica>/internal/channel/<iid>/<secret>``.
The worker's delivery then stays an ordinary HTTP POST (``AgentTransport``, fencing,
retries and dead letters untouched) to that replica, which forwards it as a ``deliver``
frame and answers with the status and body of the agent's ``result`` frame. A replica
that does not hold the socket (it closed, the agent moved to another replica) answers 503:
a transient failure, retried, and by then the instance's endpoint names the new holder.

The secret is per socket, random, and compared in constant time: the internal route is not
authenticated by API key, so only whoever read the instance's endpoint from the store (a
worker) can address it, and the agent still checks every delivery's reach token.

Reachability: the prober never dials a channel instance (its ``next_probe_at`` is parked
far ahead); the hub's ``ping`` frames and their ``pong`` answers are its probe samples
(RTT, loss), and the channel closing records a failed one. Heartbeats travel on the
channel too, so a channel that stays down is an instance whose heartbeats stopped:
offline after the usual missed intervals.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from reach.core.fleet.endpoints import Endpoint
from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.scoring import ProbeSample
from reach.core.interop.channel import encode
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.probing import ProbeOutcome
from reach.hub.fleet.reachability import Policy
from reach.hub.storage.models import InstanceEventRow, InstanceRow
from reach.wire.schemas import RegisterRequest, RegisterResponse

log = logging.getLogger("reach.hub.interop.channel")

INTERNAL_PREFIX = "/internal/channel/"
NEVER_PROBE = 1e15  # next_probe_at of a channel instance: the channel's pings probe it
ACK_TIMEOUT_S = 5.0  # a delivery frame unacknowledged this long: the channel is not working


class NotHere(Exception):
    """This process holds no open channel for the instance (or the secret is not its)."""


@dataclass(slots=True)
class Attempt:
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    answer: asyncio.Future[tuple[int, dict[str, Any]]] | None = None


class Channel:
    """One agent's open socket on this process; ``send`` writes a text frame."""

    def __init__(self, agent_id: str, instance_id: str, send: Any) -> None:
        self.agent_id = agent_id
        self.instance_id = instance_id
        self.secret = secrets.token_urlsafe(24)
        self._send = send
        self._write = asyncio.Lock()
        self.pending: dict[tuple[str, int], Attempt] = {}
        self.closed = False

    async def send(self, kind: str, **fields: Any) -> None:
        async with self._write:
            await self._send(encode(kind, **fields))

    async def deliver(
        self,
        task_id: str,
        attempt_seq: int,
        method: str,
        raw: bytes,
        authorization: str | None,
        timeout: float,
    ) -> tuple[int, dict[str, Any]] | None:
        """Send one attempt and wait for the agent's answer; None if none came in time.
        ``raw`` is the delivery body's bytes as the worker posted them: they travel as
        they are (base64), since the reach token binds their digest."""
        if self.closed:
            raise NotHere
        loop = asyncio.get_running_loop()
        attempt = Attempt(answer=loop.create_future())
        key = (task_id, attempt_seq)
        self.pending[key] = attempt
        assert attempt.answer is not None
        try:
            await self.send(
                "deliver",
                task_id=task_id,
                attempt_seq=attempt_seq,
                method=method,
                raw=base64.b64encode(raw).decode(),
                authorization=authorization,
            )
            deadline = loop.time() + timeout
            try:
                await asyncio.wait_for(attempt.acked.wait(), min(ACK_TIMEOUT_S, timeout))
                left = max(0.0, deadline - loop.time())
                return await asyncio.wait_for(asyncio.shield(attempt.answer), left)
            except TimeoutError:
                return None
        finally:
            if self.pending.get(key) is attempt:
                del self.pending[key]

    def acknowledge(self, key: tuple[str, int]) -> bool:
        attempt = self.pending.get(key)
        if attempt is None:
            return False
        attempt.acked.set()
        return True

    def answer(self, key: tuple[str, int], status: int, body: dict[str, Any]) -> bool:
        attempt = self.pending.get(key)
        if attempt is None or attempt.answer is None or attempt.answer.done():
            return False
        attempt.acked.set()
        attempt.answer.set_result((status, body))
        return True

    def close(self) -> None:
        """Fail every waiting delivery: the worker sees a transient failure and retries."""
        self.closed = True
        for attempt in self.pending.values():
            if attempt.answer is not None and not attempt.answer.done():
                attempt.answer.set_exception(NotHere())
            attempt.acked.set()


class Channels:
    """The channels this process holds, by instance id."""

    def __init__(self) -> None:
        self._by_instance: dict[str, Channel] = {}

    def open(self, channel: Channel) -> None:
        previous = self._by_instance.get(channel.instance_id)
        if previous is not None and previous is not channel:
            previous.close()  # the agent reconnected before the old socket was noticed dead
        self._by_instance[channel.instance_id] = channel

    def drop(self, channel: Channel) -> None:
        channel.close()
        if self._by_instance.get(channel.instance_id) is channel:
            del self._by_instance[channel.instance_id]

    def holding(self, instance_id: str, secret: str) -> Channel:
        channel = self._by_instance.get(instance_id)
        if channel is None or channel.closed or not hmac.compare_digest(channel.secret, secret):
            raise NotHere
        return channel

    def __len__(self) -> int:
        return len(self._by_instance)


def holder_url(host: str, port: int, instance_id: str, secret: str) -> str:
    """The endpoint a channel instance is registered with: this replica, as the agent
    reached it (the worker reaches the same address)."""
    return Endpoint("http", host, port, f"{INTERNAL_PREFIX}{instance_id}/{secret}").url


def is_channel_endpoint(endpoint: str) -> bool:
    return INTERNAL_PREFIX in endpoint


def register(
    session: Session,
    declared: RegisterRequest,
    endpoint: str,
    now: float,
    policy: Policy,
    limits: registry.Limits = registry.DEFAULT_LIMITS,
    owner: str | None = None,
) -> RegisterResponse:
    """Register (or refresh) a channel instance at ``endpoint``; the prober leaves it be.

    A reconnect gets a new secret, maybe a new replica: the stored endpoint moves with it
    (registration would refuse an HTTP instance that moved without deregistering).

    The new socket also starts a new epoch of the instance's breaker
    (``breaker_opened_at``, which keys its failure windows, see ``reach.hub.flow.breakers``):
    the failures counted so far were deliveries to the socket that is gone (its replica
    died: refused; or it no longer held it: 503), and the agent has just answered on a new
    one. An open breaker closes; stale attempts still failing on the old endpoint cannot
    open it again. Before, the instance's tasks waited out the trial interval (30 s) after
    every reconnect that followed a replica's death."""
    req = declared.model_copy(
        update={"addr": endpoint, "public_endpoint": None, "allow_loopback": True}
    )
    assert req.instance_id is not None
    row = session.get(InstanceRow, req.instance_id, with_for_update=True)
    if (
        row is not None
        and row.agent_id == req.agent_id
        and row.status != InstanceStatus.DEREGISTERED
        and is_channel_endpoint(row.endpoint)
    ):
        row.endpoint = endpoint
        if row.breaker_open_until is not None:
            session.add(
                InstanceEventRow(
                    instance_id=row.instance_id,
                    agent_id=row.agent_id,
                    kind="breaker_closed",
                    detail={"opened_at": row.breaker_opened_at, "reason": "channel_reopened"},
                    at=now,
                )
            )
            row.breaker_open_until = None
            row.consecutive_failure_count = 0
        row.breaker_opened_at = now  # evidence from before this socket opens nothing
    # the endpoint is a replica of this hub's, not an address the agent chose
    answer = registry.register(session, req, now, policy, limits, owner=owner, judged=False)
    row = session.get(InstanceRow, req.instance_id)
    if row is not None:
        row.next_probe_at = NEVER_PROBE
    return answer.model_copy(update={"endpoint": "channel"})


def record_ping(
    session: Session,
    instance_id: str,
    ok: bool,
    rtt_ms: float | None,
    at: float,
    error: str | None,
    now: float,
    policy: Policy,
) -> None:
    """One ping of the channel as the instance's probe sample (RTT and loss feed its score)."""
    row = session.get(InstanceRow, instance_id)
    if row is None or row.status == InstanceStatus.DEREGISTERED:
        return
    outcome = ProbeOutcome(instance_id, ProbeSample(ok=ok, rtt_ms=rtt_ms, at=at), error)
    monitoring.record_probe(session, outcome, now, policy)
    row.next_probe_at = NEVER_PROBE


@dataclass(slots=True)
class Pinger:
    """Outstanding pings of one channel: a pong within the timeout is a sample with its
    RTT; a ping unanswered by then is a lost one."""

    timeout: float
    sent: dict[int, tuple[float, float]] = field(default_factory=dict)  # id -> (mono, wall)
    next_id: int = 0
    answered: bool = False  # a pong came since the loop last looked

    def ping(self) -> int:
        self.next_id += 1
        self.sent[self.next_id] = (time.perf_counter(), time.time())
        return self.next_id

    def pong(self, ping_id: int) -> tuple[float, float] | None:
        """(rtt_ms, sent_at) of an answered ping, None for an unknown or late one."""
        sent = self.sent.pop(ping_id, None)
        if sent is None:
            return None
        self.answered = True
        return (time.perf_counter() - sent[0]) * 1000, sent[1]

    def lost(self) -> list[float]:
        """Sent times of pings past their timeout (forgotten: a late pong counts nothing)."""
        cutoff = time.perf_counter() - self.timeout
        late = [i for i, (mono, _) in self.sent.items() if mono < cutoff]
        return [self.sent.pop(i)[1] for i in late]
