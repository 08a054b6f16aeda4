"""Admission decisions (reach.core.flow.admission), the memory gauge's sampling and cgroup
reading (reach.hub.flow.memory), and the body limit's coherence with the payload cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from reach.core.flow.admission import (
    MAX_RETRY_MS,
    MIN_RETRY_MS,
    UNKNOWN_RATE_RETRY_MS,
    Queue,
    effective_limit,
    overloaded,
    payload_refusal,
    retry_after_ms,
    verdict,
)
from reach.hub.flow.admission import ENVELOPE_BYTES, body_limit
from reach.hub.flow.memory import MemoryGauge, cgroup_limit
from reach.hub.settings import load_settings


@pytest.mark.parametrize(
    ("override", "declared", "default", "expected"),
    [
        (None, None, 1000, 1000),  # nothing set: the router's
        (None, 50, 1000, 50),  # the agent's declaration
        (7, 50, 1000, 7),  # the admin's override wins
        (2000, None, 1000, 2000),  # an override may raise it too
    ],
)
def test_effective_limit(
    override: int | None, declared: int | None, default: int, expected: int
) -> None:
    assert effective_limit(override, declared, default) == expected


@pytest.mark.parametrize(
    ("queue", "window_s", "expected"),
    [
        (Queue("a", 5, 5, completed=0), 30.0, UNKNOWN_RATE_RETRY_MS),  # no rate known
        (Queue("a", 5, 5, completed=30), 30.0, 1000),  # 1 to drain at 1/s
        (Queue("a", 14, 5, completed=30), 30.0, 10_000),  # 10 to drain at 1/s
        (Queue("a", 5, 5, completed=3000), 30.0, MIN_RETRY_MS),  # 100/s: floored
        (Queue("a", 1000, 5, completed=1), 30.0, MAX_RETRY_MS),  # hours: capped
        (Queue("a", 5, 5, completed=10), 0.0, UNKNOWN_RATE_RETRY_MS),  # no window
        (Queue("a", 6, 5, completed=60), 30.0, 1000),  # 2 to drain at 2/s
    ],
)
def test_retry_after_ms(queue: Queue, window_s: float, expected: int) -> None:
    assert retry_after_ms(queue, window_s) == expected


@pytest.mark.parametrize(
    ("queues", "refused"),
    [
        ([], None),  # nothing to count (no agent known): admit
        ([Queue("a", 4, 5)], None),  # room
        ([Queue("a", 5, 5)], "a"),  # at the limit: full
        ([Queue("a", 9, 5)], "a"),  # past it (a lowered override)
        ([Queue("a", 5, 5), Queue("b", 0, 5)], None),  # a route: one has room
        # a route, every agent full: the one that frees a slot first is named
        ([Queue("a", 5, 5, completed=3), Queue("b", 5, 5, completed=30)], "b"),
        ([Queue("b", 5, 5), Queue("a", 5, 5)], "a"),  # a tie: by agent ID
    ],
)
def test_verdict(queues: list[Queue], refused: str | None) -> None:
    found = verdict(queues)
    assert (found.agent_id if found else None) == refused


@pytest.mark.parametrize(
    ("size", "cap", "refused"),
    [(100, 1024, False), (1024, 1024, False), (1025, 1024, True)],
)
def test_payload_refusal(size: int, cap: int, refused: bool) -> None:
    detail = payload_refusal(size, cap)
    assert (detail is not None) == refused
    if detail:
        assert str(size) in detail and str(cap) in detail
        assert "reference" in detail and "router.max_payload_bytes" in detail


@pytest.mark.parametrize(
    ("rss", "limit", "ratio", "expected"),
    [
        (None, 1000, 0.8, False),  # rss unknown
        (900, None, 0.8, False),  # no limit known: no admission
        (800, 1000, 0.8, False),  # at the threshold: still admitted
        (801, 1000, 0.8, True),
        (999, 1000, 1.0, False),
        (10, 0, 0.8, False),  # a nonsense limit is no limit
    ],
)
def test_overloaded(rss: int | None, limit: int | None, ratio: float, expected: bool) -> None:
    assert overloaded(rss, limit, ratio) is expected


def test_gauge_samples_at_most_every_interval() -> None:
    now = [0.0]
    reads: list[int] = []
    values = iter([900, 100, 100])

    def rss() -> int:
        reads.append(1)
        return next(values)

    gauge = MemoryGauge(1000, 0.8, interval_s=0.5, read_rss=rss, clock=lambda: now[0])
    assert gauge.over() is True
    now[0] = 0.4
    assert gauge.over() is True  # the last sample, not a new read
    assert len(reads) == 1
    now[0] = 0.5
    assert gauge.over() is False
    assert len(reads) == 2


def test_gauge_without_a_limit_never_reads() -> None:
    gauge = MemoryGauge(None, 0.8, read_rss=lambda: pytest.fail("read"))  # type: ignore[arg-type,return-value]
    assert gauge.over() is False


def _cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> int | None:
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    (tmp_path / "self_cgroup").write_text(proc)
    return cgroup_limit(tmp_path / "fs", tmp_path / "self_cgroup")


@pytest.mark.parametrize(
    ("proc", "files", "expected"),
    [
        ("0::/app\n", {"fs/app/memory.max": "536870912\n"}, 536_870_912),  # v2
        ("0::/app\n", {"fs/app/memory.max": "max\n"}, None),  # v2, unlimited
        # v2, the tightest of the process's cgroup and its parents
        ("0::/a/b\n", {"fs/a/memory.max": "1000000\n", "fs/a/b/memory.max": "max\n"}, 1_000_000),
        # v1; its own path not visible inside the container: the mount's root
        (
            "4:memory:/docker/x\n0::/\n",
            {"fs/memory/memory.limit_in_bytes": "268435456\n"},
            268_435_456,
        ),
        (
            "4:memory:/\n",
            {"fs/memory/memory.limit_in_bytes": "9223372036854771712\n"},
            None,
        ),  # v1, unlimited
        ("", {}, None),  # no cgroup at all
    ],
)
def test_cgroup_limit(
    tmp_path: Path, proc: str, files: dict[str, str], expected: int | None
) -> None:
    assert _cgroup(tmp_path, proc, files) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 1_048_576 + ENVELOPE_BYTES),  # the default grows to cover the payload cap
        ({"REACH_ROUTER__MAX_PAYLOAD_BYTES": "4194304"}, 4_194_304 + ENVELOPE_BYTES),
        ({"REACH_SERVER__MAX_BODY_BYTES": "8388608"}, 8_388_608),  # set higher: kept
        # set below the payload cap: raised, or the cap's 413 would never be seen
        ({"REACH_SERVER__MAX_BODY_BYTES": "65536"}, 1_048_576 + ENVELOPE_BYTES),
    ],
)
def test_body_limit_covers_the_payload_cap(env: dict[str, str], expected: int) -> None:
    assert body_limit(load_settings(environ=env)) == expected
