"""The blob store interface (the store ``blobs.store`` names: `reach.hub.blobs.configured`).

A store keeps bytes under a blob id and nothing else: who owns a blob, its size, digest
and task are rows of ``blobs`` (`reach.hub.blobs.records`). Every store takes the same
calls, and one contract test runs them all (``tests/integration/test_blob_stores.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import BinaryIO

CHUNK_BYTES = 1 << 20  # what one read hands on


class BlobBackend(ABC):
    """Bytes by blob id. Safe to call from several threads."""

    @abstractmethod
    def put(self, blob_id: str, source: BinaryIO, size: int, content_type: str) -> None:
        """Store ``size`` bytes read from ``source`` (at its start) under ``blob_id``; a
        blob is whole or absent, never half written."""

    @abstractmethod
    def read(self, blob_id: str) -> Iterator[bytes] | None:
        """The blob's bytes in chunks, or None when the store has no such blob."""

    @abstractmethod
    def delete(self, blob_id: str) -> None:
        """Remove the blob; one already gone is no error."""

    def presign(self, blob_id: str, expires_in: int) -> str | None:
        """An absolute URL that reads the blob for ``expires_in`` seconds with no other
        credential, or None: the hub serves the blob itself (its own signed link)."""
        return None
