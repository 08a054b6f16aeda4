"""Real TCP listeners standing in for agents' doors: answer after a delay, count concurrency."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ConcurrencyGauge:
    """Counts connections open at once across any number of listeners."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = 0
        self.peak = 0
        self.total = 0

    def enter(self) -> None:
        with self._lock:
            self.current += 1
            self.total += 1
            self.peak = max(self.peak, self.current)

    def leave(self) -> None:
        with self._lock:
            self.current -= 1


class SlowHttpListener:
    """Accepts on 127.0.0.1, waits ``delay`` seconds after the request, then answers 200."""

    def __init__(self, delay: float, gauge: ConcurrencyGauge | None = None) -> None:
        self.delay = delay
        self.gauge = gauge or ConcurrencyGauge()
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        self.gauge.enter()
        try:
            conn.settimeout(5)
            conn.recv(4096)
            time.sleep(self.delay)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        finally:
            self.gauge.leave()
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


@contextmanager
def slow_listeners(
    count: int, delay: float
) -> Iterator[tuple[list[SlowHttpListener], ConcurrencyGauge]]:
    gauge = ConcurrencyGauge()
    listeners = [SlowHttpListener(delay, gauge) for _ in range(count)]
    try:
        yield listeners, gauge
    finally:
        for listener in listeners:
            listener.close()


def closed_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
