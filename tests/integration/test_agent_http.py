"""The hub's HTTP edge to agents against real sockets: one deadline per attempt, a capped
answer size, and pooled connections kept across deliveries."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from reach.core.delivery.retry import Outcome, classify
from reach.hub.delivery.transports import AgentTransport

Serve = Callable[[socket.socket], None]


@contextmanager
def raw_agent(serve: Serve) -> Iterator[tuple[str, list[int]]]:
    """A TCP server that hands each accepted connection to ``serve``; counts connections."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=_guarded, args=(serve, conn), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/tasks/echo", accepted
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def _guarded(serve: Serve, conn: socket.socket) -> None:
    try:
        serve(conn)
    except OSError:
        pass  # the client gave up on us: that is what several tests provoke
    finally:
        conn.close()


def _read_request(conn: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    return True


def keep_alive_ok(conn: socket.socket) -> None:
    while _read_request(conn):
        body = b'{"code": 0, "data": "ok"}'
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )


def trickle(conn: socket.socket) -> None:
    """Headers at once, then one body byte every 0.2 s: each read is quick, the answer never."""
    _read_request(conn)
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    for _ in range(100):
        conn.sendall(b" ")
        time.sleep(0.2)


def huge(declared: bool) -> Serve:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        body = b'{"code": 0, "data": "' + b"x" * 3_000_000 + b'"}'
        if declared:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:1000])
            time.sleep(1)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 65536):
            part = body[i : i + 65536]
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        conn.sendall(b"0\r\n\r\n")

    return serve


def test_answers_reuse_one_pooled_connection() -> None:
    transport = AgentTransport()
    with raw_agent(keep_alive_ok) as (url, accepted):
        for _ in range(5):
            answer = transport.post(url, {"task_id": "t"}, 1.0, 2.0)
            assert answer.status == 200 and answer.body == {"code": 0, "data": "ok"}
        assert classify(answer.status, answer.body) is Outcome.SUCCESS
        assert len(accepted) == 1


def test_a_trickling_answer_ends_at_the_attempt_deadline() -> None:
    transport = AgentTransport()
    with raw_agent(trickle) as (url, _):
        started = time.monotonic()
        answer = transport.post(url, {"task_id": "t"}, 0.5, 1.0)
        took = time.monotonic() - started
    # before the fix: ~20 s (100 bytes, each within the read timeout)
    assert took < 3.0, took
    assert answer.status is None and answer.error_kind == "timeout"
    assert classify(answer.status, answer.body) is Outcome.TRANSIENT


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_oversize_answer_is_refused_not_buffered(declared: bool) -> None:
    transport = AgentTransport(max_body_bytes=1_048_576)
    with raw_agent(huge(declared)) as (url, _):
        answer = transport.post(url, {"task_id": "t"}, 1.0, 5.0)
    assert answer.status == 200 and answer.body is None
    assert answer.error is not None and "larger than 1048576 bytes" in answer.error
    # a protocol error the caller is told about, not retried blindly
    assert classify(answer.status, answer.body) is Outcome.BUSINESS_ERROR


def test_an_agent_that_never_answers_times_out() -> None:
    def silent(conn: socket.socket) -> None:
        _read_request(conn)
        time.sleep(5)

    transport = AgentTransport()
    with raw_agent(silent) as (url, _):
        started = time.monotonic()
        answer = transport.post(url, {"task_id": "t"}, 0.5, 0.5)
    assert time.monotonic() - started < 2.5
    assert answer.status is None and answer.error_kind == "timeout"
