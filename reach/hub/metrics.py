"""Prometheus metrics, correct across the API, worker and beat processes.

Counters and histograms use prometheus-client's multiprocess mode: every process writes
to files in one directory (``PROMETHEUS_MULTIPROC_DIR``, which the CLI sets to
``<home>/metrics`` before the client library is imported) and ``/metrics`` merges them. Per-instance
gauges (score, RTT, loss, status) are read from the registry at scrape time, so they
are right whichever process last changed them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# The CLI sets PROMETHEUS_MULTIPROC_DIR before this module is first imported; without
# it, metrics are single-process, which is what in-process tests want.
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

ENV = "PROMETHEUS_MULTIPROC_DIR"

PROBE_TOTAL = Counter("agentreach_probe_total", "Probes sent by the hub, by outcome.", ["outcome"])
PROBE_SKIPPED_TOTAL = Counter(
    "agentreach_probe_skipped_total",
    "Due probes skipped because the probe pool was full.",
)
STATUS_TRANSITIONS_TOTAL = Counter(
    "agentreach_status_transitions_total",
    "Instance status transitions.",
    ["from_status", "to_status"],
)
ALERTS_TOTAL = Counter("agentreach_alerts_total", "Reachability alerts raised.", ["alert"])
HEARTBEATS_TOTAL = Counter("agentreach_heartbeats_total", "Heartbeats received.")
AUTH_REFUSALS_TOTAL = Counter(
    "agentreach_auth_refusals_total",
    "API requests refused: no valid credential, outside its scope, or not its agent.",
    ["reason"],
)
ADMISSION_REFUSALS_TOTAL = Counter(
    "agentreach_admission_refusals_total",
    "Submits refused before anything was written: backpressure, payload_too_large, overloaded.",
    ["reason"],
)


InstanceRows = Callable[[], Iterable[dict[str, Any]]]


class RegistryCollector(Collector):
    """Per-instance gauges straight from the registry at scrape time."""

    def __init__(self, rows: InstanceRows) -> None:
        self._rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["agent_id", "instance_id"]
        score = GaugeMetricFamily("agentreach_reach_score", "ReachScore 0-100.", labels=labels)
        rtt = GaugeMetricFamily(
            "agentreach_probe_rtt_ms", "Smoothed probe round trip (ms).", labels=labels
        )
        loss = GaugeMetricFamily(
            "agentreach_probe_loss_rate", "Failed share of the probe window.", labels=labels
        )
        status = GaugeMetricFamily(
            "agentreach_instance_status",
            "1 for the instance's current status.",
            labels=[*labels, "status"],
        )
        heartbeat_age = GaugeMetricFamily(
            "agentreach_heartbeat_age_seconds",
            "Seconds since the instance's last heartbeat (the hub's clock).",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "agentreach_breaker_open",
            "1 while the instance's circuit breaker is open (out of the routing pool).",
            labels=labels,
        )
        for row in self._rows():
            key = [row["agent_id"], row["instance_id"]]
            score.add_metric(key, row["reach_score"])
            if row["rtt_ms"] is not None:
                rtt.add_metric(key, row["rtt_ms"])
            loss.add_metric(key, row["loss_rate"])
            status.add_metric([*key, row["status"]], 1.0)
            heartbeat_age.add_metric(key, row["heartbeat_age_s"])
            breaker.add_metric(key, 1.0 if row["breaker_open"] else 0.0)
        yield from (score, rtt, loss, status, heartbeat_age, breaker)


class ApprovalsCollector(Collector):
    """The pending-approvals gauges, read in the store at scrape time: how many, and how
    long the oldest has waited."""

    def __init__(self, pending: Callable[[], tuple[int, float]]) -> None:
        self._pending = pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count, oldest_s = self._pending()
        yield GaugeMetricFamily(
            "agentreach_approvals_pending",
            "Tasks parked until a human approves or rejects them.",
            value=count,
        )
        yield GaugeMetricFamily(
            "agentreach_approvals_oldest_pending_seconds",
            "Seconds the oldest pending approval has waited (0: none pending).",
            value=oldest_s,
        )


class OpenTasksCollector(Collector):
    """The hub's queue depths: tasks not yet ended, by status, counted at scrape time."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "agentreach_tasks_open",
            "Tasks not yet ended, by status (pending, dispatching, executing, waiting, "
            "awaiting_approval).",
            labels=["status"],
        )
        for status, count in sorted(self._counts().items()):
            family.add_metric([status], count)
        yield family


def render(
    rows: InstanceRows,
    pending_approvals: Callable[[], tuple[int, float]] | None = None,
    open_tasks: Callable[[], dict[str, int]] | None = None,
) -> tuple[bytes, str]:
    """The text exposition of every process's counters plus the store's gauges."""
    registry = CollectorRegistry()
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_ThisProcess())  # single process: tests, embedded use
    registry.register(RegistryCollector(rows))
    if pending_approvals is not None:
        registry.register(ApprovalsCollector(pending_approvals))
    if open_tasks is not None:
        registry.register(OpenTasksCollector(open_tasks))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _ThisProcess(Collector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


DELIVERY_TOTAL = Counter(
    "agentreach_router_delivery_total", "Delivery attempts by outcome.", ["outcome"]
)
RETRY_TOTAL = Counter("agentreach_router_retry_total", "Delivery retries scheduled.", ["reason"])
DEAD_LETTER_TOTAL = Counter("agentreach_router_dead_letter_total", "Tasks dead-lettered.")
DELIVERY_SECONDS = Histogram(
    "agentreach_router_delivery_seconds",
    "Hub-to-agent round trip of one delivery attempt, by outcome.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
APPROVALS_TOTAL = Counter(
    "agentreach_approvals_total",
    "Approval requests and their outcomes (requested, approved, rejected, expired, cancelled).",
    ["outcome"],
)
TASKS_TOTAL = Counter("agentreach_tasks_total", "Tasks reaching a terminal state.", ["status"])
BREAKER_OPEN_TOTAL = Counter(
    "agentreach_breaker_open_total", "Instance circuit breakers opened, by agent.", ["agent_id"]
)
RETRY_BUDGET_WAIT_TOTAL = Counter(
    "agentreach_retry_budget_wait_total",
    "Retries deferred because their target's retry budget was spent, by agent.",
    ["agent_id"],
)
DEPENDENCY_LOOP_SUSPECTED_TOTAL = Counter(
    "agentreach_dependency_loop_suspected_total",
    "Agent links suspected of a dependency loop (busy both ways in the alert window).",
)
CHANNEL_EVENTS_TOTAL = Counter(
    "agentreach_channel_events_total", "Agent channels (WebSockets) opened and closed.", ["event"]
)
CHANNEL_REFUSED_FRAMES_TOTAL = Counter(
    "agentreach_channel_refused_total",
    "Agent channels closed or frames refused (bad frame, wrong agent, unknown attempt).",
    ["reason"],
)
