"""The API server's edge: what a client meets before any route, in uvicorn's HTTP protocol.

uvicorn (httptools) puts no bound on a request's headers and no time limit on receiving
them, and it holds every connection it accepts: an 8 MB header and 20,000 headers were
taken, ten unfinished 16 MB headers doubled the process's memory, and 2,000 idle
connections were held without a key. `protocol` gives uvicorn a protocol class that adds,
per listener (``server.*`` settings, `EdgeLimits`):

* **a bound on the request head** (request line plus headers, ``max_header_bytes``) and on
  the number of headers (``max_headers``): past either, ``431`` ``headers-too-large`` and
  the connection is closed. A head still incomplete is bounded as it arrives (at most one
  read beyond the limit is ever buffered), not only once it is whole;
* **a header timeout** (``header_timeout_s``): a connection must deliver a request's whole
  head this soon after it opens or after the request's first byte, else it is closed
  (slowloris; an idle connection that never sends a request). Between requests the
  keep-alive timeout applies, as before;
* **a connection bound** (``max_connections``): a connection above it gets ``503``
  ``overloaded`` with ``Retry-After`` and is closed at once, so progress streams,
  long-polls and channels already open keep theirs.

Answers here are written by the protocol itself, before any ASGI app runs, as
``application/problem+json`` like every other refusal.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from reach.errors import HeadersTooLarge, HubOverloaded, ReachError
from reach.hub.settings import ServerSettings

_PROBLEM_JSON = b"application/problem+json"
_LINE_OVERHEAD = 4  # ": " and CRLF of each header line


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """What one listener allows a client before the app sees a request."""

    max_header_bytes: int = 65_536
    max_headers: int = 100
    header_timeout_s: float = 10.0
    max_connections: int = 4096

    @classmethod
    def of(cls, server: ServerSettings) -> EdgeLimits:
        return cls(
            server.max_header_bytes,
            server.max_headers,
            server.header_timeout_s,
            server.max_connections,
        )


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing a head past its limits."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `EdgeLimits` (see the module docstring)."""

    limits: ClassVar[EdgeLimits] = EdgeLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True  # no request's head is complete yet, or the next one's
        self._head_received = 0  # bytes read while awaiting the head
        self._head_bytes = 0  # the request line and headers parsed so far
        self._head_count = 0
        self._refusal: ReachError | None = None

    # -- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                HubOverloaded(
                    f"the hub holds {self.limits.max_connections} connections already: "
                    "try again shortly",
                    retry_after=1,
                )
            )
            return
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        super().data_received(data)
        if self._awaiting_head and self._refusal is None and not self.transport.is_closing():
            # the parser buffers an unfinished header whole: bound what it may hold
            self._head_received += len(data)
            if self._head_received > self.limits.max_header_bytes:
                self._refuse(self._too_large())

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head = True
        self._head_received = self._head_bytes = self._head_count = 0
        if self._head_timer is None:
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + _LINE_OVERHEAD, 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._stop_head_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:  # a callback stopped the parser: say why
            self._write_problem(self._refusal)
            return
        super().send_400_response(msg)

    # -- helpers -------------------------------------------------------------------------

    def _count(self, size: int, headers: int) -> None:
        self._head_bytes += size
        self._head_count += headers
        if self._head_count > self.limits.max_headers:
            self._refusal = HeadersTooLarge(
                f"more than {self.limits.max_headers} request headers",
                max_headers=self.limits.max_headers,
            )
            raise _HeadRefused()
        if self._head_bytes > self.limits.max_header_bytes:
            self._refusal = self._too_large()
            raise _HeadRefused()

    def _too_large(self) -> HeadersTooLarge:
        limit = self.limits.max_header_bytes
        return HeadersTooLarge(
            f"the request line and headers exceed {limit} bytes", max_header_bytes=limit
        )

    def _refuse(self, error: ReachError) -> None:
        self._refusal = error
        self._write_problem(error)

    def _write_problem(self, error: ReachError) -> None:
        self._stop_head_timer()
        body = json.dumps(error.to_problem()).encode()
        lines = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            lines.append(name + b": " + value + b"\r\n")
        for name_, value_ in error.headers().items():
            lines.append(f"{name_}: {value_}\r\n".encode("latin-1"))
        lines.append(b"content-type: " + _PROBLEM_JSON + b"\r\n")
        lines.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        lines.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(lines) + body)
        self.transport.close()

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        """No complete head within the timeout: close (nothing to answer a silent client,
        and a slow one has shown it is not waiting for an answer)."""
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self.transport.close()


def protocol(limits: EdgeLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http=`` with these limits."""
    return type("ReachHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
