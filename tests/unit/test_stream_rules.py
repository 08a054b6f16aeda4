"""Progress streams' pure rules: Last-Event-ID parsing, what a stored event streams as,
resume refusals, the order (and so the ids) of DAG and broadcast transitions, and the
SDK's SSE parser and resumption (shared by ``reach.stream`` and ``reach.aio.stream``)."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.ledger.streams import (
    broadcast_transitions,
    dag_transitions,
    parse_last_event_id,
    resume_refusal,
    stream_kind,
)
from reach.errors import HubUnavailable, ResultTimeout
from reach.sdk.stream import MAX_FAILURES, Resumption, SSEParser, StreamEvent, parse_sse


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("0", 0),
        ("17", 17),
        (" 42 ", 42),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_last_event_id_accepted(raw: str | None, expected: int | None) -> None:
    assert parse_last_event_id(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["abc", "-1", "+1", "1.5", "1e3", "0x10", "١٢", "9223372036854775808", "1" * 30, "1 2"],
)
def test_last_event_id_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="Last-Event-ID"):
        parse_last_event_id(raw)


@pytest.mark.parametrize(
    ("kind", "streamed"),
    [
        ("accepted", "status"),
        ("dispatched", "status"),
        ("ack", "status"),
        ("retry", "status"),
        ("approval_requested", "status"),
        ("progress", "progress"),
        ("terminal_success", "result"),
        ("terminal_failure", "result"),
        ("duplicate_result", None),
        ("report_refused", None),
        ("late_outcome", None),
        ("dead_letter", None),  # its terminal_failure is the result
    ],
)
def test_what_each_event_streams_as(kind: str, streamed: str | None) -> None:
    assert stream_kind(kind) == streamed


@pytest.mark.parametrize(
    ("last", "newest", "refused"),
    [(0, 0, False), (5, 5, False), (3, 5, False), (6, 5, True), (10**9, 7, True)],
)
def test_resume_refusal(last: int, newest: int, refused: bool) -> None:
    assert (resume_refusal(last, newest) is not None) is refused


def _node(node_id: str, status: str, started: float | None, finished: float | None) -> Any:
    return {"node_id": node_id, "status": status, "started_at": started, "finished_at": finished}


def test_dag_transitions_in_time_order_running_before_ending() -> None:
    nodes = [
        _node("a", "success", 1.0, 2.0),
        _node("b", "running", 2.5, None),
        _node("c", "pending", None, None),
        _node("d", "skipped", None, 2.2),
        _node("e", "failed", 3.0, 3.0),  # started and ended at once: running first
    ]
    steps = [(t.key, t.state) for t in dag_transitions(nodes)]
    assert steps == [
        ("a", "running"),
        ("a", "success"),
        ("d", "skipped"),
        ("b", "running"),
        ("e", "running"),
        ("e", "failed"),
    ]


def test_a_later_transition_only_appends() -> None:
    """Ids are positions: a new step (later in time) never moves an earlier one."""
    before = dag_transitions([_node("a", "running", 1.0, None), _node("b", "pending", None, None)])
    after = dag_transitions([_node("a", "success", 1.0, 2.0), _node("b", "running", 2.1, None)])
    assert [(t.key, t.state) for t in after[: len(before)]] == [(t.key, t.state) for t in before]


def test_broadcast_transitions_each_target_once_when_it_ended() -> None:
    results = [
        {"task_id": "t1", "status": "success", "finished_at": 5.0},
        {"task_id": "t2", "status": "pending", "finished_at": None},
        {"task_id": "t3", "status": "failed", "finished_at": 4.0},
    ]
    steps = broadcast_transitions(results, {"success", "failed", "dead", "cancelled"})
    assert [(t.key, t.state) for t in steps] == [("t3", "failed"), ("t1", "success")]


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"event: state\r\ndata: {}\r\nid: 3\r\n\r\n"], [("state", "{}", "3")]),
        ([b"event: st", b"ate\ndata: 1\n", b"\n"], [("state", "1", None)]),
        ([b"data: a\r", b"\ndata: b\r\n\r\n"], [("message", "a\nb", None)]),
        ([b": ping - 2026\r\n\r\n", b"event: x\ndata: 2\nid: 9\n\n"], [("x", "2", "9")]),
        ([b"retry: 100\n\nevent: p\ndata: 3\n\n"], [("p", "3", None)]),
        ([b"event: cut\ndata: 4\n"], []),  # no blank line: not an event yet
    ],
)
def test_parse_sse(chunks: list[bytes], expected: list[tuple[str, str, str | None]]) -> None:
    assert list(parse_sse(chunks)) == expected


def test_the_id_carries_over_to_later_events() -> None:
    events = list(parse_sse([b"id: 4\ndata: 1\n\ndata: 2\n\n"]))
    assert [e[2] for e in events] == ["4", "4"]  # the SSE rule: last id stays


@pytest.mark.parametrize(
    ("kind", "data", "final"),
    [
        ("result", {"status": "success"}, True),
        ("run", {"status": "failed"}, True),
        ("complete", {"complete": True}, True),
        ("state", {"status": "dead"}, True),
        ("state", {"status": "executing"}, False),
        ("state", {"complete": False, "results": []}, False),
        ("state", {"status": "running", "nodes": []}, False),
        ("progress", {"progress": 1.0}, False),
        ("status", {"status": "pending"}, False),
    ],
)
def test_stream_event_final(kind: str, data: dict[str, Any], final: bool) -> None:
    assert StreamEvent(kind, data, 1).final is final


def test_the_parser_gives_the_same_events_however_the_bytes_are_cut() -> None:
    raw = b": ping\r\n\r\nevent: state\r\ndata: {}\r\nid: 3\r\n\r\nevent: p\ndata: a\ndata: b\n\n"
    whole = SSEParser().feed(raw)
    parser = SSEParser()
    one_by_one = [event for i in range(len(raw)) for event in parser.feed(raw[i : i + 1])]
    assert one_by_one == whole == [("state", "{}", "3"), ("p", "a\nb", "3")]


KEY = "rk_0123456789abcdef_" + "S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t-S3cr3t"


def test_resumption_resumes_after_the_last_event_seen() -> None:
    follow = Resumption("http://hub", "/v1/tasks/t-1/stream", KEY, None, None)
    assert follow.url == "http://hub/v1/tasks/t-1/stream"
    assert follow.headers() == {"Accept": "text/event-stream", "Authorization": f"Bearer {KEY}"}
    event = follow.seen("progress", '{"progress": 0.5}', "44")
    assert event == StreamEvent("progress", {"progress": 0.5}, 44)
    assert follow.headers()["Last-Event-ID"] == "44"
    follow.seen("ping-like", "{}", None)  # an event without an id keeps the place
    assert follow.headers()["Last-Event-ID"] == "44"
    assert Resumption("h", "/p", None, None, 7).headers() == {
        "Accept": "text/event-stream",
        "Last-Event-ID": "7",
    }


def test_resumption_backs_off_and_starts_over_after_an_event() -> None:
    follow = Resumption("http://hub", "/p", None, None, None)
    assert [follow.pause() for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    follow.seen("state", "{}", "1")
    assert follow.pause() == 0.2


def test_resumption_gives_up_after_drops_in_a_row_naming_the_hub_not_the_key() -> None:
    follow = Resumption("http://hub", "/p", KEY, None, None)
    for _ in range(MAX_FAILURES - 1):
        follow.dropped("refused")
    follow.seen("state", "{}", "1")  # an event between drops: they are not in a row
    for _ in range(MAX_FAILURES - 1):
        follow.dropped("refused")
    with pytest.raises(HubUnavailable) as caught:
        follow.dropped(f"refused with Bearer {KEY}")
    assert str(caught.value).startswith("hub at http://hub is unreachable: refused with")
    assert KEY not in str(caught.value)


def test_resumption_with_a_deadline_times_out_instead() -> None:
    follow = Resumption("http://hub", "/v1/tasks/t-1/stream", None, 0.0, None)
    assert follow.read_timeout() == 0.1  # never a zero read timeout
    with pytest.raises(ResultTimeout, match="no final event from /v1/tasks/t-1/stream within 0"):
        follow.dropped("refused")
    with pytest.raises(ResultTimeout):
        follow.pause()
    assert Resumption("h", "/p", None, None, None).read_timeout() == 60.0
