"""An event loop on a thread of its own: where a process keeps its agent exchanges.

Celery's pool runs tasks on plain threads (a prefork child's main thread, the threads
pool, solo); the agent exchanges they start live on this loop instead, so a slot hands
an exchange over and takes its next task. One per process, started on first use (after
a prefork fork, never before: a loop and its sockets do not survive one). uvloop when it
is installed (uvicorn[standard] brings it): fewer CPU cycles per exchange.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("reach.hub.delivery.loop")

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # the SDK-only install, or a platform without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """A running event loop and its thread; `submit` and `run` from any other thread."""

    def __init__(self, name: str = "reach-exchanges") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started on first use in this process."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._start()
            assert self._loop is not None
            return self._loop

    def _start(self) -> None:
        loop = _new_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name=self.name, daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()

    def running(self) -> bool:
        """Whether this process has the loop started (and not stopped)."""
        with self._lock:
            return self._loop is not None and self._pid == os.getpid()

    def in_loop(self) -> bool:
        """Whether the caller runs on this loop's thread (where `run` would deadlock)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("LoopThread.run called on its own loop's thread")
        return self.submit(coro).result(timeout)

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop (what still runs on it is dropped) and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
