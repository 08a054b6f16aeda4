"""Blobs as objects of an S3-compatible bucket (AWS S3, MinIO, Ceph ...), through boto3
(``agent-reach[s3]``). The agent reads a blob with a presigned GET of the object itself:
the bytes never pass through the hub on their way to it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from reach.core.blobs.links import is_blob_id
from reach.hub.blobs.backend import CHUNK_BYTES, BlobBackend
from reach.hub.settings import BlobSettings

_MISSING = {"NoSuchKey", "404", "NotFound"}


class S3Backend(BlobBackend):
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    @classmethod
    def of(cls, settings: BlobSettings) -> S3Backend:
        access = settings.s3_access_key.get_secret_value() if settings.s3_access_key else None
        secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=settings.s3_endpoint,
            region_name=settings.s3_region,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=Config(signature_version="s3v4", retries={"mode": "standard"}),
        )
        assert settings.s3_bucket is not None  # the settings refuse store s3 without one
        return cls(client, settings.s3_bucket, settings.s3_prefix)

    def _key(self, blob_id: str) -> str:
        if not is_blob_id(blob_id):
            raise ValueError(f"not a blob id: {blob_id!r}")
        return self.prefix + blob_id

    def put(self, blob_id: str, source: BinaryIO, size: int, content_type: str) -> None:
        self.client.upload_fileobj(
            source, self.bucket, self._key(blob_id), ExtraArgs={"ContentType": content_type}
        )

    def read(self, blob_id: str) -> Iterator[bytes] | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(blob_id))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        body = answer["Body"]
        return _chunks(body)

    def delete(self, blob_id: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(blob_id))

    def presign(self, blob_id: str, expires_in: int) -> str | None:
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._key(blob_id)},
            ExpiresIn=expires_in,
        )
        return url


def _chunks(body: Any) -> Iterator[bytes]:
    try:
        while chunk := body.read(CHUNK_BYTES):
            yield chunk
    finally:
        body.close()
