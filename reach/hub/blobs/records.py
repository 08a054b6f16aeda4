"""Blob records (``blobs``): who uploaded a blob, what it holds, which task took it, and
the sweep that deletes what no task needs any more.

A blob belongs to the identity (and API key) that uploaded it: only that caller may read
it, delete it or name it as a task's ``payload_ref``; anyone else is told it does not
exist. A task takes a blob for good (`bind`, in the submit's transaction): the blob is
then deleted with its task, never before.

Deleting is two steps so that no crash leaves bytes behind without a row: a blob is
first marked ``doomed_at`` (a conditional UPDATE, which a concurrent `bind` either beats
or loses cleanly), then its bytes are deleted from the store, then its row. A doomed blob
whose bytes could not be deleted is tried again by the next sweep.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import and_, delete, exists, select, update
from sqlalchemy.orm import Session

from reach.core.blobs.links import is_blob_id, new_blob_id
from reach.core.security.auth import Principal
from reach.errors import BlobTaken, UnknownBlob
from reach.hub.blobs.backend import BlobBackend
from reach.hub.storage.models import BlobRow, TaskRow

log = logging.getLogger("reach.hub.blobs")

Transaction = Callable[[], AbstractContextManager[Session]]
SWEEP_BATCH = 500


def new_id() -> str:
    return new_blob_id(secrets.token_hex(16))


def create(
    session: Session,
    blob_id: str,
    principal: Principal,
    *,
    size: int,
    sha256: str,
    content_type: str,
    now: float,
) -> dict[str, Any]:
    """The record of a blob whose bytes the store now holds; its view."""
    row = BlobRow(
        blob_id=blob_id,
        owner=principal.identity,
        key_id=principal.key_id,
        size=size,
        sha256=sha256,
        content_type=content_type,
        created_at=now,
    )
    session.add(row)
    session.flush()
    return view(row)


def view(row: BlobRow) -> dict[str, Any]:
    return {
        "blob_id": row.blob_id,
        "size": row.size,
        "sha256": row.sha256,
        "content_type": row.content_type,
        "created_at": row.created_at,
        "task_id": row.task_id,
    }


def owns(row: BlobRow, principal: Principal) -> bool:
    """The uploader's identity, or the very key that uploaded it."""
    if row.owner == principal.identity:
        return True
    return row.key_id is not None and row.key_id == principal.key_id


NotYours = Callable[[str], None]
"""Told of a blob that exists but is another caller's (the API logs the refusal)."""


def owned(
    session: Session,
    blob_id: str,
    principal: Principal,
    *,
    lock: bool = False,
    not_yours: NotYours | None = None,
) -> BlobRow:
    """The caller's live blob; `UnknownBlob` for a missing, doomed or foreign one (not
    found and not yours look the same)."""
    row = live(session, blob_id, lock=lock)
    if row is not None and not owns(row, principal):
        if not_yours is not None:
            not_yours(f"blob {blob_id!r}")
        row = None
    if row is None:
        raise unknown(blob_id)
    return row


def live(session: Session, blob_id: str, *, lock: bool = False) -> BlobRow | None:
    """The blob's row unless it is missing or on its way out."""
    if not is_blob_id(blob_id):
        return None
    query = select(BlobRow).where(BlobRow.blob_id == blob_id, BlobRow.doomed_at.is_(None))
    if lock:
        query = query.with_for_update()
    return session.scalar(query)


def bind(session: Session, blob_id: str, principal: Principal, task_id: str) -> None:
    """Make the caller's blob the payload of ``task_id`` (in the submit's transaction):
    `UnknownBlob` if it is not the caller's, `BlobTaken` if another task has it."""
    row = owned(session, blob_id, principal, lock=True)
    if row.task_id not in (None, task_id):
        raise BlobTaken(
            f"blob {blob_id!r} is the payload of another task: upload it again for this one",
            blob_id=blob_id,
        )
    row.task_id = task_id


def remove(
    session: Session,
    blob_id: str,
    principal: Principal,
    now: float,
    not_yours: NotYours | None = None,
) -> None:
    """The owner's delete: mark the blob doomed (its bytes go next). A blob a task has
    taken goes with that task (`BlobTaken`)."""
    row = owned(session, blob_id, principal, lock=True, not_yours=not_yours)
    if row.task_id is not None:
        raise BlobTaken(
            f"blob {blob_id!r} is the payload of task {row.task_id!r}: it is deleted with it",
            blob_id=blob_id,
            task_id=row.task_id,
        )
    row.doomed_at = now


def unknown(blob_id: str) -> UnknownBlob:
    return UnknownBlob(f"blob {blob_id!r} does not exist", blob_id=blob_id)


def sweep(
    transaction: Transaction,
    store: BlobBackend,
    now: float,
    orphan_ttl_s: float,
    limit: int = SWEEP_BATCH,
) -> int:
    """Delete blobs whose task is gone (retention deleted it) and blobs no task took
    within ``orphan_ttl_s`` of their upload, plus any left doomed; how many went."""
    with transaction() as session:
        doom(session, now, orphan_ttl_s, limit)
    with transaction() as session:
        doomed = list(
            session.scalars(
                select(BlobRow.blob_id).where(BlobRow.doomed_at.is_not(None)).limit(limit)
            ).all()
        )
    return purge(transaction, store, doomed)


def doom(session: Session, now: float, orphan_ttl_s: float, limit: int) -> int:
    """Mark what must go: two reads of one snapshot, then conditional UPDATEs that a
    concurrent `bind` wins (an orphan taken meanwhile is no orphan)."""
    task_gone = and_(
        BlobRow.task_id.is_not(None), ~exists().where(TaskRow.task_id == BlobRow.task_id)
    )
    orphan = and_(BlobRow.task_id.is_(None), BlobRow.created_at < now - orphan_ttl_s)
    found = session.execute(
        select(BlobRow.blob_id, BlobRow.task_id)
        .where(BlobRow.doomed_at.is_(None), task_gone | orphan)
        .limit(limit)
    ).all()
    gone = [b for b, t in found if t is not None]
    orphans = [b for b, t in found if t is None]
    n = 0
    if gone:  # a task id never changes once set, and the task is gone for good
        n += _count(
            session.execute(
                update(BlobRow)
                .where(BlobRow.blob_id.in_(gone), BlobRow.doomed_at.is_(None))
                .values(doomed_at=now)
            )
        )
    if orphans:
        n += _count(
            session.execute(
                update(BlobRow)
                .where(
                    BlobRow.blob_id.in_(orphans),
                    BlobRow.task_id.is_(None),
                    BlobRow.doomed_at.is_(None),
                )
                .values(doomed_at=now)
            )
        )
    return n


def purge(transaction: Transaction, store: BlobBackend, doomed: list[str]) -> int:
    """Delete the bytes of doomed blobs, then their rows (a store error leaves the row
    for the next sweep)."""
    deleted: list[str] = []
    for blob_id in doomed:
        try:
            store.delete(blob_id)
        except Exception:
            log.exception(
                "could not delete blob %s from its store; the next sweep retries", blob_id
            )
            continue
        deleted.append(blob_id)
    if deleted:
        with transaction() as session:
            session.execute(
                delete(BlobRow).where(BlobRow.blob_id.in_(deleted), BlobRow.doomed_at.is_not(None))
            )
        log.info("deleted %d blob(s)", len(deleted))
    return len(deleted)


def _count(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
