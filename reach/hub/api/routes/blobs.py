"""Blob endpoints: upload a large payload (``PUT /v1/blobs``), read it back or delete it
as its owner, and serve it to the agent of its task by a signed link.

A blob is the caller's until a task takes it as ``payload_ref``; from then on it goes
with that task (`reach.hub.blobs.records`). Uploads need ``submit``, like sending. The
signed read (``GET /v1/blobs/{id}?exp=..&sig=..``) needs no key: the link is the
credential (`reach.core.blobs.links`), a forged or expired one is a 403 problem.
"""

from __future__ import annotations

import hashlib
import tempfile
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from reach.core.blobs.links import BLOB_ID_PATTERN
from reach.core.security.auth import Action, Principal
from reach.errors import BlobError, InvalidBlobLink, RequestTooLarge
from reach.hub.api.auth import not_yours, principal_of, require
from reach.hub.blobs import records
from reach.hub.context import HubContext
from reach.hub.storage.models import BlobRow

Uploads = Annotated[Principal, Depends(require(Action.SUBMIT))]
BlobId = Annotated[str, Path(pattern=BLOB_ID_PATTERN)]

PATH = "/v1/blobs"
_SPOOL_BYTES = 1 << 20  # a blob larger than this is spooled to a temporary file
_DEFAULT_TYPE = "application/octet-stream"
_MAX_TYPE = 255

_RAW_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def blob_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix=PATH, tags=["blobs"])
    settings = ctx.settings.blobs

    @router.put("", status_code=201, responses={413: {}, 422: {}}, openapi_extra=_RAW_BODY)
    async def put_blob(request: Request, principal: Uploads) -> JSONResponse:
        """Store the body as a blob (its ``Content-Type`` kept) and return its id, size
        and SHA-256. Name the id as a task's ``payload_ref``; a blob no task takes within
        ``blobs.orphan_ttl_s`` is deleted. Larger than ``blobs.max_bytes``: 413."""
        content_type = _content_type(request)
        spool, size, digest = await _receive(request, settings.max_bytes)
        blob_id = records.new_id()
        try:
            await run_in_threadpool(ctx.blob_store.put, blob_id, spool, size, content_type)
        finally:
            spool.close()

        def record(session: Any) -> dict[str, Any]:
            return records.create(
                session,
                blob_id,
                principal,
                size=size,
                sha256=digest,
                content_type=content_type,
                now=ctx.clock.now(),
            )

        try:
            view = await run_in_threadpool(ctx.write, record)
        except BaseException:
            await run_in_threadpool(ctx.blob_store.delete, blob_id)  # no bytes without a row
            raise
        view["unreferenced_until"] = view["created_at"] + settings.orphan_ttl_s
        return JSONResponse(view, status_code=201)

    @router.get("/{blob_id}", responses={403: {}, 404: {}})
    def get_blob(blob_id: BlobId, request: Request) -> StreamingResponse:
        """The blob's bytes: for its owner (a key), or for anyone holding a link the hub
        signed (``?exp=..&sig=..``, delivered with the task) until it expires."""
        query = request.query_params
        if "sig" in query or "exp" in query:
            why = ctx.blob_links.refusal(
                blob_id, query.get("exp"), query.get("sig"), ctx.clock.now()
            )
            if why is not None:
                raise InvalidBlobLink(f"blob link refused: {why}", blob_id=blob_id)
            with ctx.reading() as session:
                row = records.live(session, blob_id)
                if row is None:
                    raise records.unknown(blob_id)
                return _stream(ctx, row)
        principal = principal_of(request)
        refused = _refusal(request, principal)
        with ctx.reading() as session:
            return _stream(ctx, records.owned(session, blob_id, principal, not_yours=refused))

    @router.delete("/{blob_id}", responses={404: {}, 409: {}})
    def delete_blob(blob_id: BlobId, request: Request, principal: Uploads) -> dict[str, Any]:
        """Delete a blob no task has taken (one a task took goes with the task: 409)."""
        refused = _refusal(request, principal)
        ctx.write(lambda s: records.remove(s, blob_id, principal, ctx.clock.now(), refused))
        records.purge(ctx.transaction, ctx.blob_store, [blob_id])  # else the sweep does
        return {"blob_id": blob_id, "deleted": True}

    return router


def _refusal(request: Request, principal: Principal) -> records.NotYours:
    """Logs and counts a key reaching for another caller's blob."""
    return lambda what: not_yours(request, principal, what)


def _content_type(request: Request) -> str:
    value = request.headers.get("content-type") or _DEFAULT_TYPE
    if len(value) > _MAX_TYPE or not value.isascii() or not value.isprintable():
        raise BlobError(f"content-type: at most {_MAX_TYPE} printable ASCII characters")
    return value


async def _receive(request: Request, cap: int) -> tuple[BinaryIO, int, str]:
    """The body, spooled (to disk past a MiB), with its size and SHA-256; `RequestTooLarge`
    past ``cap`` (the edge's body limit stops a declared length earlier)."""
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # closed by the caller
    digest = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    pending_bytes = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise RequestTooLarge(
                    f"blob exceeds blobs.max_bytes ({cap} bytes)", limit=cap, size=size
                )
            digest.update(chunk)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= _SPOOL_BYTES:  # disk writes off the event loop, a MiB at a time
                await run_in_threadpool(spool.write, b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            await run_in_threadpool(spool.write, b"".join(pending))
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool, size, digest.hexdigest()  # type: ignore[return-value]


def _stream(ctx: HubContext, row: BlobRow) -> StreamingResponse:
    chunks = ctx.blob_store.read(row.blob_id)
    if chunks is None:  # its bytes are gone (a sweep in progress)
        raise records.unknown(row.blob_id)
    return StreamingResponse(
        chunks,
        media_type=row.content_type,
        headers={
            "Content-Length": str(row.size),
            "X-Blob-Sha256": row.sha256,
            "Cache-Control": "no-store",
        },
    )
