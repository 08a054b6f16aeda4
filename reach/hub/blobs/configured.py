"""The blob store a hub's settings name (``blobs.store``); an S3 store imports boto3 only
when it is chosen."""

from __future__ import annotations

from pathlib import Path

from reach.errors import ConfigError
from reach.hub.blobs.backend import BlobBackend
from reach.hub.blobs.backends.directory import DirectoryBackend
from reach.hub.settings import BlobSettings


def backend_for(settings: BlobSettings, home: Path) -> BlobBackend:
    """The store ``settings`` name (an S3 store imports boto3 only here)."""
    if settings.store == "s3":
        try:
            from reach.hub.blobs.backends.s3 import S3Backend
        except ImportError as exc:
            raise ConfigError(
                f"blobs.store s3 needs boto3: pip install 'agent-reach[s3]' ({exc})",
                key="blobs.store",
            ) from None
        return S3Backend.of(settings)
    return DirectoryBackend(Path(settings.dir).expanduser() if settings.dir else home / "blobs")
