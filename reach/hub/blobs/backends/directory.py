"""Blobs as files of one directory: written to a temporary name, then renamed, so a
reader never sees half a blob. Every hub process that serves or sweeps blobs must see
the same directory (one machine, or a shared volume)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from reach.core.blobs.links import is_blob_id
from reach.hub.blobs.backend import CHUNK_BYTES, BlobBackend


class DirectoryBackend(BlobBackend):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, blob_id: str) -> Path:
        if not is_blob_id(blob_id):  # never a path of the caller's making
            raise ValueError(f"not a blob id: {blob_id!r}")
        return self.root / blob_id

    def put(self, blob_id: str, source: BinaryIO, size: int, content_type: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK_BYTES)
            os.replace(tmp, self._path(blob_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read(self, blob_id: str) -> Iterator[bytes] | None:
        try:
            handle = self._path(blob_id).open("rb")
        except FileNotFoundError:
            return None
        return _chunks(handle)

    def delete(self, blob_id: str) -> None:
        self._path(blob_id).unlink(missing_ok=True)


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk
