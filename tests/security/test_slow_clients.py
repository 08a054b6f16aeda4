"""Unbounded headers and slowloris (issue 37, item 9), with real sockets against a real
``reach api`` process (`reach.hub.api.edge`).

Before: an 8 MB header and 20,000 headers were accepted, ten unfinished 16 MB headers took
the API from 178 to 369 MB, and 2,000 idle connections were held 75 s without a key.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.security.edge_hub import TYPE, EdgeHub, edge_hub

HEADER_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 64
MB = 1 << 20
pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[EdgeHub]:
    limits = {
        "REACH_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "REACH_SERVER__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
    with edge_hub(store_url, tmp_path, **limits) as running:
        yield running


def connect(hub: EdgeHub, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return sock


def send_all(sock: socket.socket, data: bytes, chunk: int = 64 * 1024) -> int:
    """Send ``data`` until the server stops taking it; how many bytes went."""
    sent = 0
    with contextlib.suppress(OSError):  # the server answered and closed: a reset or EPIPE
        for start in range(0, len(data), chunk):
            sock.sendall(data[start : start + chunk])
            sent += min(chunk, len(data) - start)
    return sent


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the one answer before the server closes."""
    raw = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), raw[:200]
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def problem(body: bytes) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(body)
    return found


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_an_8_mb_header_is_refused_with_431_before_it_is_read(hub: EdgeHub) -> None:
    with connect(hub) as sock:
        request = b"GET /healthz HTTP/1.1\r\nHost: hub\r\nX-Big: " + b"a" * (8 * MB) + b"\r\n\r\n"
        sent = send_all(sock, request)
        status, headers, body = read_answer(sock)
    assert status == 431 and headers["content-type"] == "application/problem+json"
    assert problem(body)["type"] == TYPE + "headers-too-large"
    assert "65536 bytes" in problem(body)["detail"]
    # the hub closed before the head was through (what was sent sits in kernel buffers)
    assert sent < len(request), "the whole 8 MB head was taken"


def test_20000_headers_are_refused_with_431(hub: EdgeHub) -> None:
    lines = b"".join(b"X-N%d: 1\r\n" % i for i in range(20_000))
    with connect(hub) as sock:
        send_all(sock, b"GET /healthz HTTP/1.1\r\nHost: hub\r\n" + lines + b"\r\n")
        status, _, body = read_answer(sock)
    assert status == 431
    assert problem(body)["detail"] == "more than 100 request headers"
    # a request within the limits is served as before (a browser sends a dozen or two)
    headers = {f"X-Extra-{i}": "x" * 100 for i in range(90)}
    assert requests.get(f"{hub.url}/healthz", headers=headers, timeout=10).status_code == 200


def test_unfinished_huge_headers_do_not_grow_the_process(hub: EdgeHub) -> None:
    pid = hub.proc.proc.pid
    before = rss_bytes(pid)
    socks = [connect(hub) for _ in range(10)]
    try:
        threads = []
        for sock in socks:  # 16 MB of one header each, never finished
            data = b"GET /healthz HTTP/1.1\r\nHost: hub\r\nX-Big: " + b"a" * (16 * MB)
            thread = threading.Thread(target=send_all, args=(sock, data))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(30)
        statuses = [read_answer(sock)[0] for sock in socks]
        grown = rss_bytes(pid) - before
    finally:
        for sock in socks:
            sock.close()
    assert statuses == [431] * 10
    assert grown < 40 * MB, f"the API grew by {grown / MB:.0f} MB"


def test_idle_and_slow_connections_without_a_key_are_cut(hub: EdgeHub) -> None:
    idle = [connect(hub) for _ in range(40)]  # connect, say nothing
    slow = [connect(hub) for _ in range(10)]  # a head, a byte at a time (slowloris)
    stop = threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            for sock in slow:
                sock.sendall(b"GET /api/v1/agents HTTP/1.1\r\nHost: hub\r\n")
            while not stop.wait(0.5):
                for sock in slow:
                    sock.sendall(b"X")

    started = time.monotonic()
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        cut = [closed_by_server(sock, HEADER_TIMEOUT_S + 10) for sock in idle + slow]
        took = time.monotonic() - started
    finally:
        stop.set()
        thread.join(5)
        for sock in idle + slow:
            sock.close()
    assert all(cut), f"{cut.count(False)} of {len(cut)} connections still open"
    assert took < HEADER_TIMEOUT_S + 8, took
    # a connection that sends its request in time is served, and kept alive after it
    with requests.Session() as session:
        assert session.get(f"{hub.url}/healthz", timeout=10).status_code == 200
        time.sleep(HEADER_TIMEOUT_S + 1)  # idle between requests: the keep-alive timeout
        assert session.get(f"{hub.url}/healthz", timeout=10).status_code == 200


def test_connections_past_the_bound_are_refused_with_503(hub: EdgeHub) -> None:
    held = [connect(hub) for _ in range(MAX_CONNECTIONS)]
    try:
        with connect(hub) as extra:
            status, headers, body = read_answer(extra)
        assert status == 503 and headers["retry-after"] == "1"
        assert problem(body)["type"] == TYPE + "overloaded"
    finally:
        for sock in held:
            sock.close()
    # the held ones gone, the hub answers again
    time.sleep(0.5)
    assert requests.get(f"{hub.url}/healthz", timeout=10).status_code == 200
