"""Large payloads by reference (issue 39, item 10) through real processes (api, worker,
beat) on PostgreSQL + Redis, with authentication on, the blobs in the hub's directory.

A caller uploads 5 MiB (``PUT /v1/blobs``) and sends a task naming it as ``payload_ref``;
a slow async SDK agent reads it by the link its delivery carries and answers with its
digest. The link is the only credential: forged or expired, it is a 403 problem. Another
caller's key cannot read, delete or send the blob; a blob goes with one task, and is
deleted with it. An upload past ``blobs.max_bytes`` is a 413 problem; inline payloads
keep their 1 MiB cap.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from reach.core.blobs.links import query
from reach.core.ops.retention import RetentionPolicy
from reach.core.security.auth import Scope
from reach.hub.blobs import records
from reach.hub.blobs.backends.directory import DirectoryBackend
from reach.hub.blobs.links import KEY_PURPOSE
from reach.hub.ops import retention
from reach.hub.security.sealing import SealKey
from reach.hub.storage import create_engine_for, session_factory
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import PROBLEM, Key, make_key, online, reach_cli
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.parametrize("shared_store_url", ["postgres"], indirect=True),
]

MiB = 1024 * 1024
STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_BLOBS__MAX_BYTES": str(6 * MiB),
}
STACK_WORKER_CONCURRENCY = 1
AGENT = "blob-reader"


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key
    other: Key
    agent: Key


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        caller=make_key(shared_store_url, Scope.CALLER),
        other=make_key(shared_store_url, Scope.CALLER),
        agent=make_key(shared_store_url, Scope.AGENT, AGENT),
    )


class Seen:
    """What the agent was handed: each task's blob link (the test reuses them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.links: dict[str, str] = {}

    def add(self, task_id: str, url: str) -> None:
        with self.lock:
            self.links[task_id] = url


@pytest.fixture(scope="module")
def seen(shared_stack: Stack, keys: Keys) -> Iterator[Seen]:
    """A slow async SDK agent: reads its task's blob, thinks a while, answers its digest."""
    seen = Seen()
    agent = reach.Agent(
        AGENT, capabilities=[{"type": "digest"}], hub=shared_stack.url, api_key=keys.agent.secret,
        addr=f"127.0.0.1:{free_port()}", allow_loopback=True, heartbeat_interval=0.5,
    )  # fmt: skip

    @agent.route("digest")
    async def digest(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        ref = reach.payload_blob_ref()
        assert ref is not None and ref.url is not None
        seen.add(task_id, ref.url)
        data = await reach.aio.payload_blob()
        await asyncio.sleep(1.0)  # slow: the exchange outlives the read
        return {
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "name": payload.get("name"),
            "content_type": ref.content_type,
        }

    agent.start()
    try:
        wait_until(lambda: online(shared_stack, keys.admin, AGENT), timeout=30, what="agent online")
        yield seen
    finally:
        agent.close()


def _put(stack: Stack, key: Key, data: bytes, content_type: str = "image/tiff") -> Any:
    return reach.put_blob(data, content_type=content_type, hub=stack.url, api_key=key.secret)


def _send(stack: Stack, key: Key, blob_id: str, **extra: Any) -> str:
    return reach.send(
        agent_id=AGENT, method="digest", payload={"name": "scan"}, payload_ref=blob_id,
        hub=stack.url, api_key=key.secret, **extra,
    ).task_id  # fmt: skip


def _done(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    result = reach.wait_for_result(task_id, timeout=90, hub=stack.url, api_key=key.secret)
    assert result.task["status"] == "success", result.task
    data: dict[str, Any] = result.task["result"]
    return data


def _problem(r: requests.Response, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["type"] == PROBLEM + slug
    return body


def test_a_5_mib_payload_reaches_a_slow_async_agent_by_reference(
    shared_stack: Stack, keys: Keys, seen: Seen
) -> None:
    data = os.urandom(5 * MiB)
    blob = _put(shared_stack, keys.caller, data)
    assert blob.size == len(data) and blob.sha256 == hashlib.sha256(data).hexdigest()
    task_id = _send(shared_stack, keys.caller, blob.blob_id)
    answer = _done(shared_stack, keys.caller, task_id)
    assert answer == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": 5 * MiB,
        "name": "scan",
        "content_type": "image/tiff",
    }
    # the owner reads it back with its key, as it was stored
    r = requests.get(
        f"{shared_stack.url}/v1/blobs/{blob.blob_id}", headers=keys.caller.headers(), timeout=30
    )
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "image/tiff"


def test_a_forged_or_expired_link_is_a_403_problem(
    shared_stack: Stack, keys: Keys, seen: Seen
) -> None:
    blob = _put(shared_stack, keys.caller, b"secret bytes")
    task_id = _send(shared_stack, keys.caller, blob.blob_id)
    _done(shared_stack, keys.caller, task_id)
    link = seen.links[task_id]
    assert link.startswith(f"/v1/blobs/{blob.blob_id}?")  # served by the hub (dir store)
    url = shared_stack.url + link
    assert requests.get(url, timeout=10).content == b"secret bytes"  # no key: the link is one

    path, _, signed = link.partition("?")
    params = dict(p.split("=", 1) for p in signed.split("&"))
    forged_sig = params["sig"][:-2] + ("AA" if not params["sig"].endswith("AA") else "BB")
    later = int(params["exp"]) + 3600
    for forged in (
        f"{path}?exp={params['exp']}&sig={forged_sig}",  # another signature
        f"{path}?exp={later}&sig={params['sig']}",  # stretched in time
        f"/v1/blobs/{records.new_id()}?{signed}",  # another blob
    ):
        body = _problem(
            requests.get(shared_stack.url + forged, timeout=10), 403, "invalid-blob-link"
        )
        assert params["sig"] not in body["detail"]
    # a link the hub signed, whose time is up (signed here with the hub's own derived key)
    key = SealKey.load(None, shared_stack.home).derive(KEY_PURPOSE)
    expired = f"{path}?{query(key, blob.blob_id, int(time.time()) - 5)}"
    body = _problem(requests.get(shared_stack.url + expired, timeout=10), 403, "invalid-blob-link")
    assert "expired" in body["detail"]
    # without a link, a key is needed
    assert requests.get(shared_stack.url + path, timeout=10).status_code == 401


def test_another_callers_key_cannot_use_the_blob(
    shared_stack: Stack, keys: Keys, seen: Seen
) -> None:
    blob = _put(shared_stack, keys.caller, b"mine")
    base = f"{shared_stack.url}/v1/blobs/{blob.blob_id}"
    _problem(requests.get(base, headers=keys.other.headers(), timeout=10), 404, "unknown-blob")
    _problem(requests.delete(base, headers=keys.other.headers(), timeout=10), 404, "unknown-blob")
    with pytest.raises(reach.UnknownBlob):
        _send(shared_stack, keys.other, blob.blob_id)
    # the owner's task takes it; a second task may not
    task_id = _send(shared_stack, keys.caller, blob.blob_id)
    with pytest.raises(reach.BlobTaken):
        _send(shared_stack, keys.caller, blob.blob_id)
    assert _done(shared_stack, keys.caller, task_id)["size"] == 4
    # the same task sent again (idempotent on task_id) is the same task, not a conflict
    again = _send(shared_stack, keys.caller, blob.blob_id, task_id=task_id)
    assert again == task_id
    # a blob no task took: its owner may delete it, and then it is gone
    spare = _put(shared_stack, keys.caller, b"spare")
    spare_url = f"{shared_stack.url}/v1/blobs/{spare.blob_id}"
    assert requests.delete(spare_url, headers=keys.caller.headers(), timeout=10).ok
    _problem(
        requests.get(spare_url, headers=keys.caller.headers(), timeout=10), 404, "unknown-blob"
    )


def test_oversize_uploads_and_inline_payloads_are_413_problems(
    shared_stack: Stack, keys: Keys
) -> None:
    url = f"{shared_stack.url}/v1/blobs"
    big = b"x" * (6 * MiB + 1)
    declared = requests.put(url, data=big, headers=keys.caller.headers(), timeout=60)
    _problem(declared, 413, "payload-too-large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused as it streams in
        for _ in range(7):
            yield b"y" * MiB

    streamed = requests.put(url, data=chunks(), headers=keys.caller.headers(), timeout=60)
    _problem(streamed, 413, "payload-too-large")
    with pytest.raises(reach.ReachError) as refused:  # the inline cap is unchanged
        reach.send(
            agent_id=AGENT, method="digest", payload={"blob": "z" * (MiB + 1)},
            hub=shared_stack.url, api_key=keys.caller.secret,
        )  # fmt: skip
    assert refused.value.problem_type() == PROBLEM + "payload-too-large"


def test_the_cli_uploads_a_file_and_sends_it_by_reference(
    shared_stack: Stack, keys: Keys, seen: Seen, tmp_path: Path
) -> None:
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(os.urandom(2 * MiB))
    key = ["--hub", shared_stack.url, "--api-key", keys.caller.secret]
    put = reach_cli(shared_stack, "blobs", "put", str(scan), *key)
    assert put.returncode == 0, put.stderr
    blob = json.loads(put.stdout)
    assert blob["content_type"] == "application/pdf" and blob["size"] == 2 * MiB
    sent = reach_cli(
        shared_stack, "send", "digest", "--agent", AGENT, "--payload-ref", blob["blob_id"], *key
    )
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)["result"]
    assert answer["sha256"] == hashlib.sha256(scan.read_bytes()).hexdigest()
    missing = reach_cli(shared_stack, "blobs", "put", str(tmp_path / "nope"), *key)
    assert missing.returncode == 2


def test_a_blob_is_deleted_with_its_task(
    shared_stack: Stack, shared_store_url: str, keys: Keys, seen: Seen
) -> None:
    blob = _put(shared_stack, keys.caller, b"goes with its task")
    task_id = _send(shared_stack, keys.caller, blob.blob_id)
    _done(shared_stack, keys.caller, task_id)
    stored = shared_stack.home / "blobs" / blob.blob_id
    assert stored.exists()
    engine = create_engine_for(shared_store_url)
    try:
        db = session_factory(engine)
        later = time.time() + 31 * 86400  # past the default 30 days: retention deletes the task
        deleted = retention.sweep(db.begin, later, RetentionPolicy())
        assert deleted.get("tasks", 0) >= 1
        gone = records.sweep(db.begin, DirectoryBackend(shared_stack.home / "blobs"), later, 86400)
    finally:
        engine.dispose()
    assert gone >= 1
    assert not stored.exists()
    r = requests.get(
        f"{shared_stack.url}/v1/blobs/{blob.blob_id}", headers=keys.caller.headers(), timeout=10
    )
    _problem(r, 404, "unknown-blob")
