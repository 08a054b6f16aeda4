"""The blob stores (``reach.hub.blobs.backends``) keep one contract: a directory, and an
S3 bucket on a real local S3 server (moto's ``moto_server``, a subprocess on loopback).
Their records (``reach.hub.blobs.records``) on both databases: a blob is its uploader's,
goes with the one task that takes it, and the sweep deletes -- bytes and row -- exactly
the blobs whose task is gone and those no task took in time. The SDK reads an S3 blob by
the presigned link a delivery carries, and refuses bytes that do not match."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

import reach
import reach.aio
from reach.core.security.auth import Principal, Scope
from reach.errors import BlobTaken, UnknownBlob
from reach.hub.blobs import records
from reach.hub.blobs.backend import BlobBackend
from reach.hub.blobs.backends.directory import DirectoryBackend
from reach.hub.blobs.links import BlobLinks
from reach.hub.settings import BlobSettings
from reach.hub.storage import session_factory
from reach.hub.storage.models import BlobRow, TaskRow
from reach.sdk import trace
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

BUCKET = "reach-blobs"
NOW = 1_700_000_000.0
TTL = 3600.0
ALICE = Principal(Scope.CALLER, key_id="alice0000001")
BOB = Principal(Scope.CALLER, key_id="bob000000001")


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 server process on loopback, with the test bucket."""
    pytest.importorskip("boto3")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Path(sys.executable).parent / "moto_server"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(endpoint), timeout=30, what="moto_server up")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        requests.get(url, timeout=1)
    except requests.RequestException:
        return False
    return True


def _s3(endpoint: str) -> BlobBackend:
    from reach.hub.blobs.backends.s3 import S3Backend

    settings = BlobSettings(
        store="s3",
        s3_endpoint=endpoint,
        s3_bucket=BUCKET,
        s3_region="us-east-1",
        s3_access_key="test",  # type: ignore[arg-type]
        s3_secret_key="test",  # type: ignore[arg-type]
    )
    backend = S3Backend.of(settings)
    try:
        backend.client.create_bucket(Bucket=BUCKET)
    except backend.client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return backend


@pytest.fixture(params=["dir", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobBackend:
    if request.param == "dir":
        return DirectoryBackend(tmp_path / "blobs")
    return _s3(request.getfixturevalue("s3_endpoint"))


def _read(store: BlobBackend, blob_id: str) -> bytes | None:
    chunks = store.read(blob_id)
    return None if chunks is None else b"".join(chunks)


def test_what_is_put_reads_back_whole(store: BlobBackend) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # more than one chunk, not a multiple of one
    blob_id = records.new_id()
    store.put(blob_id, io.BytesIO(data), len(data), "image/tiff")
    got = _read(store, blob_id)
    assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_a_missing_blob_reads_as_none_and_deletes_quietly(store: BlobBackend) -> None:
    blob_id = records.new_id()
    assert store.read(blob_id) is None
    store.delete(blob_id)  # nothing there: no error
    store.put(blob_id, io.BytesIO(b"x"), 1, "text/plain")
    store.delete(blob_id)
    store.delete(blob_id)
    assert store.read(blob_id) is None


def test_a_path_is_never_a_blob_id(store: BlobBackend) -> None:
    for bad in ("../escape", "b-" + "0" * 32 + "/../x", ""):
        with pytest.raises(ValueError):
            store.put(bad, io.BytesIO(b"x"), 1, "text/plain")
        with pytest.raises(ValueError):
            store.delete(bad)


def test_presign_reads_the_blob_from_the_store_itself_or_is_the_hubs_to_serve(
    store: BlobBackend,
) -> None:
    blob_id = records.new_id()
    store.put(blob_id, io.BytesIO(b"payload"), 7, "text/plain")
    url = store.presign(blob_id, 60)
    if isinstance(store, DirectoryBackend):
        assert url is None  # the hub serves it, under its own signed link
        return
    assert url is not None and url.startswith("http://127.0.0.1:")
    r = requests.get(url, timeout=10)
    assert r.status_code == 200 and r.content == b"payload"
    # (the S3 server checks its own signatures; moto does not, so that is not tested here)


# -- records, on both databases ------------------------------------------------------------


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _upload(db: sessionmaker[Session], store: BlobBackend, who: Principal, at: float) -> str:
    blob_id = records.new_id()
    store.put(blob_id, io.BytesIO(b"bytes of " + blob_id.encode()), 40, "text/plain")
    with db.begin() as s:
        records.create(s, blob_id, who, size=40, sha256="0" * 64, content_type="text/plain", now=at)
    return blob_id


def _task(db: sessionmaker[Session], task_id: str) -> None:
    with db.begin() as s:
        s.add(
            TaskRow(
                task_id=task_id, agent_id="a", target={"agent_id": "a"}, method="m",
                payload={}, status="success", attempt_seq=1, created_at=NOW, updated_at=NOW,
            )
        )  # fmt: skip


def test_only_the_uploader_may_bind_and_a_blob_goes_with_one_task(
    db: sessionmaker[Session], tmp_path: Path
) -> None:
    store = DirectoryBackend(tmp_path)
    blob_id = _upload(db, store, ALICE, NOW)
    with db.begin() as s, pytest.raises(UnknownBlob):
        records.bind(s, blob_id, BOB, "t-bob")
    with db.begin() as s:
        records.bind(s, blob_id, ALICE, "t-1")
    with db.begin() as s:
        records.bind(s, blob_id, ALICE, "t-1")  # the same task submitted again
    with db.begin() as s, pytest.raises(BlobTaken):
        records.bind(s, blob_id, ALICE, "t-2")
    with db.begin() as s, pytest.raises(BlobTaken):
        records.remove(s, blob_id, ALICE, NOW)  # it goes with t-1
    with db.begin() as s, pytest.raises(UnknownBlob):
        records.bind(s, records.new_id(), ALICE, "t-3")


def test_the_sweep_deletes_exactly_the_blobs_no_task_needs(
    db: sessionmaker[Session], store: BlobBackend
) -> None:
    fresh_orphan = _upload(db, store, ALICE, NOW - TTL + 60)
    old_orphan = _upload(db, store, ALICE, NOW - TTL - 60)
    live_task = _upload(db, store, ALICE, NOW - 10 * TTL)
    gone_task = _upload(db, store, BOB, NOW - 10)
    deleted_by_owner = _upload(db, store, BOB, NOW)
    _task(db, "t-live")
    with db.begin() as s:
        records.bind(s, live_task, ALICE, "t-live")
        records.bind(s, gone_task, BOB, "t-gone")  # its task row was deleted (retention)
        records.remove(s, deleted_by_owner, BOB, NOW)

    assert records.sweep(db.begin, store, NOW, TTL) == 3
    with db() as s:
        left = set(s.scalars(select(BlobRow.blob_id)).all())
    assert left == {fresh_orphan, live_task}
    for kept in left:
        assert _read(store, kept) is not None
    for gone in (old_orphan, gone_task, deleted_by_owner):
        assert _read(store, gone) is None
    assert records.sweep(db.begin, store, NOW, TTL) == 0  # nothing more


def test_an_agent_reads_an_s3_blob_by_the_presigned_link_its_delivery_carries(
    s3_endpoint: str,
) -> None:
    """With the S3 store the delivery's link is the bucket's own: the SDK reads the bytes
    from there (never through the hub) and checks them against the recorded digest."""
    store = _s3(s3_endpoint)
    data = os.urandom(2 * 1024 * 1024)
    row = BlobRow(
        blob_id=records.new_id(), owner="key:alice", size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), content_type="application/pdf", created_at=NOW,
    )  # fmt: skip
    store.put(row.blob_id, io.BytesIO(data), len(data), row.content_type)
    links = BlobLinks(b"k" * 32, 300.0, store)
    ref = links.descriptor(row, time.time())
    assert ref["url"].startswith(s3_endpoint) and ref["sha256"] == row.sha256
    with trace.handling("t-1", None, "reader", hub="http://127.0.0.1:9", blob=ref):
        assert reach.payload_blob() == data
        assert asyncio.run(reach.aio.payload_blob()) == data
    altered = {**ref, "sha256": "0" * 64}
    with (
        trace.handling("t-2", None, "reader", hub="http://127.0.0.1:9", blob=altered),
        pytest.raises(reach.ProtocolError),
    ):
        reach.payload_blob()
    with trace.handling("t-3", None, "reader"), pytest.raises(reach.UnknownBlob):
        reach.payload_blob()  # this task carries none
