"""The public surface is exactly what ``reach.__all__`` lists; changing it is a decision."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import reach

EXPECTED_ALL = [
    "ACCEPTED",
    "AddressRefused",
    "Agent",
    "AgentTimeout",
    "AgentUnreachable",
    "ApprovalExpired",
    "ApprovalRejected",
    "Backpressure",
    "BlobTaken",
    "BroadcastResult",
    "BusinessError",
    "CallbackRefused",
    "Capability",
    "CircuitOpen",
    "ConfigError",
    "DagError",
    "DeadLettered",
    "DeliveryError",
    "Forbidden",
    "HubOverloaded",
    "HubUnavailable",
    "IllegalTransition",
    "InvalidBlobLink",
    "InvalidPayload",
    "InvalidReachToken",
    "InvalidRegistration",
    "InvalidSignature",
    "InvalidTaskRequest",
    "LoopDetected",
    "LoopbackAddress",
    "Match",
    "NoSuitableAgent",
    "ProtocolError",
    "ReachError",
    "RegistrationConflict",
    "RegistryError",
    "RegistryLimit",
    "ResultTimeout",
    "RoutingError",
    "SecurityError",
    "SemanticMatchingOff",
    "SessionClosed",
    "StaleReport",
    "StreamEvent",
    "Submission",
    "TLSConfig",
    "TaskConflict",
    "TaskError",
    "TaskResult",
    "TooManyAuthFailures",
    "Unauthenticated",
    "UnknownAgent",
    "UnknownBlob",
    "UnknownInstance",
    "UnknownSession",
    "UnknownTask",
    "__version__",
    "aio",
    "broadcast",
    "close_session",
    "find",
    "get_session",
    "get_task",
    "open_session",
    "payload_blob",
    "payload_blob_ref",
    "put_blob",
    "report_progress",
    "report_result",
    "send",
    "session_alive",
    "stream",
    "verify_callback",
    "verify_webhook",
    "wait_for_result",
]


# reach.aio: the coroutine twin of each of these (and aclose, for its pools)
TWINS = [
    "broadcast",
    "close_session",
    "find",
    "get_session",
    "get_task",
    "open_session",
    "payload_blob",
    "report_progress",
    "report_result",
    "send",
    "session_alive",
    "stream",
    "wait_for_result",
]

NOT_ERRORS = {
    "ACCEPTED",
    "payload_blob",
    "payload_blob_ref",
    "put_blob",
    "Agent",
    "BroadcastResult",
    "broadcast",
    "Capability",
    "Match",
    "Submission",
    "StreamEvent",
    "TLSConfig",
    "TaskResult",
    "__version__",
    "aio",
    "close_session",
    "find",
    "get_session",
    "get_task",
    "open_session",
    "report_progress",
    "report_result",
    "send",
    "session_alive",
    "stream",
    "verify_callback",
    "verify_webhook",
    "wait_for_result",
}


def test_all_is_the_expected_surface() -> None:
    assert reach.__all__ == EXPECTED_ALL


def test_all_is_sorted_and_without_duplicates() -> None:
    assert reach.__all__ == sorted(set(reach.__all__))


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_public_name_is_importable(name: str) -> None:
    module = importlib.import_module("reach")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from reach import {name}", namespace)
    assert namespace[name] is getattr(reach, name)


def test_star_import_gives_exactly_the_public_surface() -> None:
    namespace: dict[str, object] = {}
    exec("from reach import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == EXPECTED_ALL


@pytest.mark.parametrize("name", [n for n in EXPECTED_ALL if n not in NOT_ERRORS])
def test_every_other_public_name_is_a_reach_error(name: str) -> None:
    assert issubclass(getattr(reach, name), reach.ReachError)


def test_version_is_a_string() -> None:
    assert isinstance(reach.__version__, str) and reach.__version__


def test_aio_is_the_twins_and_aclose() -> None:
    assert reach.aio.__all__ == sorted([*TWINS, "aclose"])


@pytest.mark.parametrize("name", TWINS)
def test_each_aio_twin_takes_what_its_sync_function_takes(name: str) -> None:
    sync, twin = getattr(reach, name), getattr(reach.aio, name)
    assert inspect.signature(twin).parameters == inspect.signature(sync).parameters
    if name == "stream":  # an async iterator, for ``async for``
        assert inspect.isasyncgen(twin("t-1", hub="http://127.0.0.1:9"))
    else:
        assert inspect.iscoroutinefunction(twin)


def test_import_reach_loads_neither_aiohttp_nor_requests() -> None:
    """A fresh interpreter: ``import reach`` stays light; ``reach.aio`` brings aiohttp."""
    script = (
        "import sys, reach\n"
        "print(sorted(m for m in ('aiohttp', 'requests') if m in sys.modules))\n"
        "reach.aio\n"
        "print('aiohttp' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")
    assert out[:2] == ["[]", "True"], out
