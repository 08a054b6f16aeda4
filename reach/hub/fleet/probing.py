"""Active probes: the hub's own view of whether an instance's door answers.

A probe opens a TCP connection to the instance's reachable address, sends a minimal
``GET /healthz`` (to an A2A instance: a ``GET`` of its agent card; an MCP server gets an
MCP ``ping`` instead, ``reach.hub.interop.mcp.servers.probe``) and waits for the
first byte of an HTTP status line. Any status line counts as an answer: the point is
that the process is accepting and reading, which a bare TCP handshake cannot show (the
kernel completes it even for a frozen process). The round trip is measured from the start
of the connect to that first byte.

Probes have their own threads and a concurrency limit (default 8) that is global to
the hub: a round claims *probe leases* in the database, and when the limit is reached
the remaining due instances are skipped (and counted), never queued behind delivery.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from reach.core.fleet.endpoints import parse_endpoint
from reach.core.fleet.scoring import ProbeSample
from reach.core.security.networks import NetworkRule
from reach.hub.security.networks import Resolve, judge_host, resolve


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    instance_id: str
    url: str
    path: str = "/healthz"  # an A2A instance is asked for its card instead
    protocol: str = "reach"  # mcp: an MCP ping, not an HTTP GET (``mcp.servers.probe``)


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    instance_id: str
    sample: ProbeSample
    error: str | None


def probe_once(
    target: ProbeTarget,
    timeout: float,
    now: Callable[[], float] = time.time,
    rule: NetworkRule | None = None,
    resolver: Resolve = resolve,
) -> ProbeOutcome:
    """One probe; never raises for network trouble (that is the measurement).

    With a ``rule`` (the hub's, `reach.core.security.networks`) the name is resolved first and
    every address judged; the probe then connects to the first judged address itself,
    so DNS cannot answer differently between the check and the connection. A refused
    address is a failed probe, and nothing is sent."""
    ep = parse_endpoint(target.url)
    started = time.perf_counter()
    at = now()
    failed = ProbeSample(ok=False, rtt_ms=None, at=at)
    address = ep.host
    if rule is not None:
        try:
            addresses, why = judge_host(ep.host, ep.port, rule, resolver)
        except OSError:
            return ProbeOutcome(target.instance_id, failed, "the name does not resolve")
        if why is not None:
            return ProbeOutcome(target.instance_id, failed, f"address refused: {why}")
        address = addresses[0]
    try:
        with socket.create_connection((address, ep.port), timeout=timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            deadline = started + timeout
            host = f"[{ep.host}]" if ":" in ep.host else ep.host
            sock.sendall(
                f"GET {ep.path}{target.path} HTTP/1.1\r\nHost: {host}:{ep.port}\r\n"
                "User-Agent: reach-probe\r\nConnection: close\r\n\r\n".encode()
            )
            sock.settimeout(max(0.001, deadline - time.perf_counter()))
            first = sock.recv(16)
            rtt_ms = (time.perf_counter() - started) * 1000
        if not first.startswith(b"HTTP/"):
            reason = "connection closed without an answer" if not first else "not an HTTP answer"
            return ProbeOutcome(
                target.instance_id, ProbeSample(ok=False, rtt_ms=None, at=at), reason
            )
        return ProbeOutcome(target.instance_id, ProbeSample(ok=True, rtt_ms=rtt_ms, at=at), None)
    except TimeoutError:
        error = f"timeout after {timeout:.1f}s"
    except ConnectionRefusedError:
        error = "connection refused"
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror or exc}"
    return ProbeOutcome(target.instance_id, ProbeSample(ok=False, rtt_ms=None, at=at), error)


class ProbePool:
    """Threads for probes in this process, never more than ``size`` at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="reach-probe")
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0

    def try_submit(self, fn: Callable[[], None]) -> Future[None] | None:
        """Run ``fn`` on a probe thread, or return None at once if all are busy."""
        if not self._slots.acquire(blocking=False):
            return None
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)

        def run() -> None:
            try:
                fn()
            finally:
                with self._lock:
                    self.active -= 1
                self._slots.release()

        return self._executor.submit(run)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
