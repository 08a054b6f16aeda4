"""What a delivery tells its agent about the task's blob: size, digest and a link that
reads it until it expires (``reach.core.blobs.links``; an S3 store's presigned URL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reach.core.blobs import links
from reach.hub.blobs.backend import BlobBackend
from reach.hub.storage.models import BlobRow

KEY_PURPOSE = "blob links"  # the seal key's derivation for link signatures


@dataclass(frozen=True)
class BlobLinks:
    """Makes and checks the links of one hub (every process derives the same key)."""

    key: bytes
    ttl_s: float
    store: BlobBackend
    public_url: str | None = None  # unset: a path the agent's SDK joins to its hub's URL

    def __repr__(self) -> str:  # never the key
        return f"BlobLinks(ttl_s={self.ttl_s}, store={type(self.store).__name__})"

    def path(self, blob_id: str, now: float) -> tuple[str, int]:
        """A hub-served link to ``blob_id`` and its expiry."""
        exp = links.expiry(now, self.ttl_s)
        return (
            f"{self.public_url or ''}/v1/blobs/{blob_id}?{links.query(self.key, blob_id, exp)}",
            exp,
        )

    def descriptor(self, row: BlobRow, now: float) -> dict[str, Any]:
        """The delivery's ``payload_ref``: the blob's facts and a link valid ``ttl_s``."""
        url, exp = self.path(row.blob_id, now)
        presigned = self.store.presign(row.blob_id, max(1, int(exp - now)))
        return {
            "blob_id": row.blob_id,
            "url": presigned or url,
            "expires_at": exp,
            "size": row.size,
            "sha256": row.sha256,
            "content_type": row.content_type,
        }

    def refusal(self, blob_id: str, exp: str | None, sig: str | None, now: float) -> str | None:
        return links.refusal(self.key, blob_id, exp, sig, now)
