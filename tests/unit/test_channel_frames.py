"""The channel's frame gate (``reach.core.interop.channel.parse``): every refusal, table-tested."""

from __future__ import annotations

import json

import pytest

from reach.core.interop.channel import (
    FROM_AGENT,
    FROM_HUB,
    FrameError,
    encode,
    parse,
    redacted,
    shown_endpoint,
)

REFUSED = [
    ("{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"type": "deliver"}', "unknown frame type"),  # the hub's frame, from an agent
    ('{"type": 7}', "unknown frame type"),
    ('{"type": "ack", "attempt_seq": 1}', "task_id"),
    ('{"type": "ack", "task_id": "", "attempt_seq": 1}', "task_id"),
    ('{"type": "ack", "task_id": "t", "attempt_seq": true}', "attempt_seq"),
    ('{"type": "ack", "task_id": "t", "attempt_seq": -1}', "attempt_seq"),
    ('{"type": "result", "task_id": "t", "attempt_seq": 1, "body": {}}', "status"),
    ('{"type": "result", "task_id": "t", "attempt_seq": 1, "status": 99, "body": {}}', "status"),
    ('{"type": "result", "task_id": "t", "attempt_seq": 1, "status": 200, "body": []}', "body"),
    ('{"type": "hello"}', "register"),
    ('{"type": "pong", "id": "x"}', "id"),
    ('{"type": "heartbeat", "heartbeat": 3}', "heartbeat"),
]


@pytest.mark.parametrize(("raw", "why"), REFUSED)
def test_refused(raw: str | bytes, why: str) -> None:
    with pytest.raises(FrameError) as refused:
        parse(raw, FROM_AGENT)
    assert why in refused.value.reason
    assert "{not" not in refused.value.reason  # never echoes the frame


def test_oversize_is_refused_before_parsing() -> None:
    with pytest.raises(FrameError, match="larger than 10 bytes"):
        parse(json.dumps({"type": "pong", "id": 1}), FROM_AGENT, max_bytes=10)


def test_accepted() -> None:
    frame = parse(
        encode("result", task_id="t", attempt_seq=2, status=200, body={"code": 0}), FROM_AGENT
    )
    assert frame.type == "result" and frame.attempt == ("t", 2)
    deliver = parse(encode("deliver", task_id="t", attempt_seq=0, method="m", raw="e30="), FROM_HUB)
    assert deliver.attempt == ("t", 0)
    with pytest.raises(FrameError):
        parse(encode("deliver", task_id="t", attempt_seq=0, method=1, raw="e30="), FROM_HUB)


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (
            "http://10.0.0.5:8800/internal/channel/i-1/s3cr3t",
            "http://10.0.0.5:8800/internal/channel/i-1/***",
        ),
        (
            "http://10.0.0.5:8800/internal/channel/i-1/s3cr3t/tasks/x",
            "http://10.0.0.5:8800/internal/channel/i-1/***",
        ),
        ("http://agent:9000", "http://agent:9000"),
    ],
)
def test_a_view_never_shows_a_channel_secret(stored: str, shown: str) -> None:
    assert shown_endpoint(stored) == shown
    assert "s3cr3t" not in shown_endpoint(stored)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "ConnectionError: Max retries exceeded with url: "
            "/internal/channel/i-1/s3cr3t-_x/tasks/task.process (Caused by ...)",
            "ConnectionError: Max retries exceeded with url: "
            "/internal/channel/i-1/***/tasks/task.process (Caused by ...)",
        ),
        ("'http://h:1/internal/channel/i-1/s3cr3t'", "'http://h:1/internal/channel/i-1/***'"),
        ("a/internal/channel/i-1/s3cr3t and /internal/channel/i-2/s3cr3t", None),
        ("read timed out (read timeout=2.0)", "read timed out (read timeout=2.0)"),
    ],
)
def test_a_delivery_error_never_quotes_a_channel_secret(text: str, shown: str | None) -> None:
    assert "s3cr3t" not in redacted(text)
    if shown is not None:
        assert redacted(text) == shown
