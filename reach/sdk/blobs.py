"""Large payloads by reference: upload a blob, send it as a task's ``payload_ref``, and
read it inside the agent's handler.

A caller uploads the bytes (`put_blob`: ``PUT /v1/blobs``) and sends a task naming the
blob (``reach.send(..., payload_ref=blob.blob_id)``); the inline ``payload`` keeps its
1 MiB cap and may still carry the small fields. The agent's delivery carries the blob's
size, SHA-256 and a short-lived link; `payload_blob` (``reach.aio.payload_blob`` in a
coroutine) reads it and checks both, so a handler never works on a truncated or altered
blob. The blob is deleted with its task.

    blob = reach.put_blob(open("scan.tiff", "rb").read(), content_type="image/tiff")
    reach.send(agent_id="ocr", method="read", payload={"lang": "en"}, payload_ref=blob.blob_id)

    @agent.handler("read")
    def read(task_id, payload):
        image = reach.payload_blob()  # bytes
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import IO

import requests

from reach.errors import HubUnavailable, ProtocolError, UnknownBlob
from reach.sdk import trace
from reach.sdk.hub_client import (
    answer,
    auth_headers,
    default_hub_url,
    refused,
    resolve_api_key,
    shared_session,
    unavailable,
)

__all__ = ["BlobRef", "PutBlob", "payload_blob", "payload_blob_ref", "put_blob"]

UPLOAD_TIMEOUT_S = 300.0  # a large blob over a slow link
_KEYS = ("blob_id", "size", "sha256")


@dataclass(frozen=True, slots=True)
class PutBlob:
    """An uploaded blob: name ``blob_id`` as a task's ``payload_ref`` before
    ``unreferenced_until`` (epoch seconds), or it is deleted."""

    blob_id: str
    size: int
    sha256: str
    content_type: str
    unreferenced_until: float | None = None


@dataclass(frozen=True, slots=True)
class BlobRef:
    """The blob a delivery carries: its facts and a link valid until ``expires_at``."""

    blob_id: str
    url: str | None
    expires_at: float | None
    size: int | None
    sha256: str | None
    content_type: str | None


def put_blob(
    data: bytes | IO[bytes],
    *,
    content_type: str = "application/octet-stream",
    hub: str | None = None,
    api_key: str | None = None,
    timeout: float = UPLOAD_TIMEOUT_S,
) -> PutBlob:
    """Upload ``data`` (bytes, or a binary file streamed as it is read) as a blob of this
    caller's. Past the hub's ``blobs.max_bytes``: `RequestTooLarge`."""
    base = (hub or trace.hub_of_current() or default_hub_url()).rstrip("/")
    key = resolve_api_key(api_key if api_key is not None else trace.api_key_of_current())
    headers = {**auth_headers(key), "Content-Type": content_type}
    try:
        resp = shared_session(base).put(
            base + "/v1/blobs", data=data, headers=headers, timeout=(3.0, timeout)
        )
    except requests.RequestException as exc:
        error, cause = unavailable(
            base, exc, timed_out=isinstance(exc, requests.Timeout), api_key=key
        )
        raise error from cause
    body = answer(
        resp.status_code,
        resp.headers.get("Content-Type"),
        resp.content,
        _KEYS,
        f"PUT {base}/v1/blobs",
        key,
    )
    return PutBlob(
        body["blob_id"],
        body["size"],
        body["sha256"],
        body.get("content_type") or content_type,
        body.get("unreferenced_until"),
    )


def payload_blob_ref() -> BlobRef | None:
    """Inside a handler: the blob its task carries (None: it carries none)."""
    ref = trace.blob_of_current()
    if ref is None or not isinstance(ref.get("blob_id"), str):
        return None
    return BlobRef(
        ref["blob_id"],
        ref.get("url") if isinstance(ref.get("url"), str) else None,
        ref.get("expires_at"),
        ref.get("size"),
        ref.get("sha256"),
        ref.get("content_type"),
    )


def payload_blob(*, timeout: float = UPLOAD_TIMEOUT_S) -> bytes:
    """Inside a handler: the bytes of the blob its task carries, checked against the
    size and SHA-256 the hub recorded. Raises `UnknownBlob` (no blob, or it is gone),
    `InvalidBlobLink` (the link expired: read it early in the handler), `HubUnavailable`
    or `ProtocolError` (the bytes do not match)."""
    ref, url = link()
    try:
        resp = requests.get(url, timeout=(3.0, timeout))
    except requests.RequestException as exc:
        raise unreachable(url, exc) from None  # its text holds the link's signature
    if resp.status_code >= 400:
        raise refused(resp.status_code, resp.content, None)
    return checked(ref, resp.content)


def link() -> tuple[BlobRef, str]:
    """The current handler's blob and the absolute URL to read it by."""
    ref = payload_blob_ref()
    if ref is None:
        raise UnknownBlob("this task carries no payload_ref (or this is not inside a handler)")
    if ref.url is None:
        raise UnknownBlob(f"blob {ref.blob_id!r} is gone", blob_id=ref.blob_id)
    if ref.url.startswith("/"):  # a path on the hub this agent talks to
        return ref, (trace.hub_of_current() or default_hub_url()).rstrip("/") + ref.url
    return ref, ref.url


def checked(ref: BlobRef, data: bytes) -> bytes:
    """``data`` if it is the blob the hub recorded; `ProtocolError` otherwise."""
    if ref.size is not None and len(data) != ref.size:
        raise ProtocolError(
            f"blob {ref.blob_id!r}: read {len(data)} bytes, the hub recorded {ref.size}",
            blob_id=ref.blob_id,
        )
    if ref.sha256 is not None and hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ProtocolError(
            f"blob {ref.blob_id!r}: its SHA-256 differs from the one the hub recorded",
            blob_id=ref.blob_id,
        )
    return data


def unreachable(url: str, exc: BaseException) -> HubUnavailable:
    """The error of a failed read, naming the link without its query: its signature is a
    credential, never shown in an error or a traceback."""
    what = (
        "did not answer in time"
        if isinstance(exc, TimeoutError | requests.Timeout)
        else ("is unreachable")
    )
    return HubUnavailable(f"blob link {url.split('?', 1)[0]} {what} ({type(exc).__name__})")
