"""Server-sent events cut into ``(event, data, id)``: what the SDKs read from the hub's
streams and the hub's worker from an agent's streaming answer (one parser, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["SSEParser", "parse_sse"]


class SSEParser:
    """An SSE byte stream cut into events as its chunks arrive (`feed`), whichever client
    reads them: comments, pings and ``retry:`` are skipped; an event is complete at its
    blank line, and a line cut between chunks waits for the rest."""

    def __init__(self) -> None:
        self._buffer = ""
        self._event = ""
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes | str) -> list[tuple[str, str, str | None]]:
        """``(event, data, id)`` of each event this chunk completes."""
        self._buffer += chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
        done: list[tuple[str, str, str | None]] = []
        while True:
            buffer = self._buffer
            cut = min((i for i in (buffer.find("\r"), buffer.find("\n")) if i >= 0), default=-1)
            if cut < 0:
                break
            if buffer[cut] == "\r" and cut + 1 == len(buffer):
                break  # a \r at the end: its \n may be in the next chunk
            line = buffer[:cut]
            step = 2 if buffer.startswith("\r\n", cut) else 1
            self._buffer = buffer[cut + step :]
            if not line:
                if self._data or self._event:
                    done.append((self._event or "message", "\n".join(self._data), self._id))
                self._event, self._data = "", []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
            elif name == "id" and "\0" not in value:
                self._id = value
        return done


def parse_sse(chunks: Iterable[bytes | str]) -> Iterator[tuple[str, str, str | None]]:
    """``(event, data, id)`` of each event in an SSE byte stream (see `SSEParser`; a
    trailing event without its blank line is not yielded)."""
    parser = SSEParser()
    for chunk in chunks:
        yield from parser.feed(chunk)
