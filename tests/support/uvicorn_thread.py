"""An ASGI app under a real uvicorn server on a loopback port, in a thread of the test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def uvicorn_serving(app: Any, port: int, *, lifespan: str = "on") -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1:``port`` until the block ends; yields the base URL.

    Leaving the block stops the server the way a SIGTERM would: connections drain, then
    the lifespan shutdown runs (and its failures surface here)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan=lifespan, log_level="warning", loop="asyncio"
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError(f"uvicorn on port {port} did not start: {failure}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), f"uvicorn on port {port} did not stop"
        assert not failure, failure
