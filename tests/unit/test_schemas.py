"""Tables for the wire records: what a registration, capability or heartbeat may say."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from reach.wire.schemas import Capability, HeartbeatRequest, RegisterRequest

# -- Capability ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "task.process"},
        {"type": "doc/summarise:v2", "description": "summarise a document"},
        {"type": "x", "params_schema": {}},
        {
            "type": "x",
            "params_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 10}},
                "required": ["text"],
                "additionalProperties": False,
            },
            "return_schema": {"type": "array", "items": {"type": "number"}},
        },
        {"type": "x", "params_schema": {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}},
        {"type": "x", "params_schema": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        {"type": "x", "estimated_latency": 0},
        {"type": "x", "danger_level": "high", "require_approval": True},
    ],
)
def test_valid_capabilities(fields: dict[str, Any]) -> None:
    cap = Capability.model_validate(fields)
    assert cap.type == fields["type"]


def test_capability_defaults() -> None:
    cap = Capability(type="x")
    assert cap.params_schema == {"type": "object"}
    assert cap.return_schema is None
    assert cap.danger_level == "low"
    assert cap.require_approval is False


@pytest.mark.parametrize(
    ("field", "schema", "where"),
    [
        ("params_schema", {"type": "nope"}, "at type"),
        ("params_schema", {"type": 5}, "at type"),
        ("params_schema", {"required": "a"}, "at required"),
        ("params_schema", {"properties": {"a": {"type": 5}}}, "at properties/a/type"),
        ("params_schema", {"$defs": {"a": {"minimum": "x"}}}, "at $defs/a/minimum"),
        ("params_schema", {"items": {"maxItems": -1}}, "at items/maxItems"),
        ("return_schema", {"type": "nope"}, "at type"),
        ("return_schema", {"properties": {"b": {"enum": 1}}}, "at properties/b/enum"),
    ],
)
def test_invalid_json_schema_is_rejected_with_its_path(
    field: str, schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Capability.model_validate({"type": "x", field: schema})
    error = caught.value.errors()[0]
    assert error["loc"] == (field,)
    assert f"{field} is not a valid JSON Schema {where}:" in error["msg"]


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"type": "x", "danger_level": "extreme"}, ("danger_level",)),
        ({"type": "x", "danger_level": "LOW"}, ("danger_level",)),
        ({"type": ""}, ("type",)),
        ({"type": " x"}, ("type",)),
        ({"type": "a b"}, ("type",)),
        ({"type": ".x"}, ("type",)),
        ({"type": "x\n"}, ("type",)),
        ({"type": "x" * 129}, ("type",)),
        ({"type": "x", "estimated_latency": -1}, ("estimated_latency",)),
        ({"type": "x", "description": "d" * 2001}, ("description",)),
        ({"type": "x", "bogus": 1}, ("bogus",)),
        ({}, ("type",)),
    ],
)
def test_invalid_capabilities(fields: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        Capability.model_validate(fields)
    assert caught.value.errors()[0]["loc"] == loc


def test_capability_type_of_maximum_length() -> None:
    assert Capability(type="x" * 128).type == "x" * 128


# -- RegisterRequest -----------------------------------------------------------------------

BASE = {"agent_id": "doc-analyzer-01", "addr": "10.0.0.5:7001"}


def register(**fields: Any) -> RegisterRequest:
    return RegisterRequest.model_validate({**BASE, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"agent_id": "a"},
        {"agent_id": "A9._:-z"},
        {"agent_id": "a" * 128},
        {"instance_id": "i" * 64},
        {"addr": "https://agent.example:8443/reach"},
        {"addr": "0.0.0.0:7001", "public_endpoint": "http://10.0.0.5:7001"},
        {"tags": ["doc", "nlp/en", "v1.2"]},
        {"max_concurrency": 1},
        {"max_concurrency": 100_000},
        {"capabilities": [{"type": "a"}, {"type": "b"}]},
        {"metadata": {"region": "eu", "gpu": True, "cores": 8, "ram": 1.5}},
    ],
)
def test_valid_registrations(fields: dict[str, Any]) -> None:
    register(**fields)


def test_tags_are_sorted() -> None:
    assert register(tags=["b", "c", "a"]).tags == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("fields", "loc", "words"),
    [
        ({"colour": "red"}, ("colour",), "Extra inputs are not permitted"),
        ({"heartbeat": 10}, ("heartbeat",), "Extra inputs are not permitted"),
        ({"tags": ["a", "b", "a"]}, ("tags",), "tags must be unique"),
        ({"tags": ["a b"]}, ("tags", 0), "pattern"),
        ({"tags": ["t"] * 65}, ("tags",), "at most 64"),
        (
            {"capabilities": [{"type": "x"}, {"type": "y"}, {"type": "x"}]},
            (),
            "capability type 'x' is declared twice",
        ),
        ({"capabilities": [{"type": "bad type"}]}, ("capabilities", 0, "type"), "pattern"),
        ({"agent_id": ""}, ("agent_id",), "pattern"),
        ({"agent_id": "-a"}, ("agent_id",), "pattern"),
        ({"agent_id": "_a"}, ("agent_id",), "pattern"),
        ({"agent_id": "a b"}, ("agent_id",), "pattern"),
        ({"agent_id": "a/b"}, ("agent_id",), "pattern"),
        ({"agent_id": "a\n"}, ("agent_id",), "pattern"),
        ({"agent_id": "é"}, ("agent_id",), "pattern"),
        ({"agent_id": "a" * 129}, ("agent_id",), "pattern"),
        ({"instance_id": "i" * 65}, ("instance_id",), "pattern"),
        ({"max_concurrency": 0}, ("max_concurrency",), "greater than or equal to 1"),
        ({"max_concurrency": -1}, ("max_concurrency",), "greater than or equal to 1"),
        ({"max_concurrency": 100_001}, ("max_concurrency",), "less than or equal to 100000"),
        ({"heartbeat_interval": 0}, ("heartbeat_interval",), "greater than or equal"),
        ({"heartbeat_interval": 3601}, ("heartbeat_interval",), "less than or equal"),
        ({"addr": ""}, ("addr",), "at least 1"),
        ({"addr": "10.0.0.5"}, ("addr",), "must name a port"),
        ({"addr": "10.0.0.5:0"}, ("addr",), "port 0"),
        ({"addr": "10.0.0.5:99999"}, ("addr",), "invalid port"),
        ({"addr": "ftp://h:21"}, ("addr",), "unsupported scheme"),
        ({"addr": "u:p@h:1"}, ("addr",), "credentials"),
        ({"public_endpoint": "h:1?q=1"}, ("public_endpoint",), "query"),
        ({"metadata": {"k": [1]}}, ("metadata", "k"), ""),
        ({"metadata": {"k" * 65: 1}}, ("metadata",), "at most 64"),
    ],
)
def test_invalid_registrations(fields: dict[str, Any], loc: tuple[Any, ...], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        register(**fields)
    error = caught.value.errors()[0]
    assert error["loc"][: len(loc)] == loc
    assert words in error["msg"]


@pytest.mark.parametrize("missing", ["agent_id", "addr"])
def test_registration_requires(missing: str) -> None:
    fields = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ValidationError) as caught:
        RegisterRequest.model_validate(fields)
    assert caught.value.errors()[0]["loc"] == (missing,)


# -- HeartbeatRequest ----------------------------------------------------------------------

BEAT = {"agent_id": "a1", "instance_id": "i1"}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"in_flight": 0, "current_load": 0.0, "consecutive_failure_count": 0},
        {"in_flight": 8, "current_load": 1.0, "max_concurrency": 8},
        {"current_load": 2.5},  # more in flight than declared is reported, not refused
        {"last_task_duration_ms": 0},
        {"sent_at": -1.0},  # the agent's clock is recorded, never trusted or checked
    ],
)
def test_valid_heartbeats(fields: dict[str, Any]) -> None:
    HeartbeatRequest.model_validate({**BEAT, **fields})


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"in_flight": -1}, ("in_flight",)),
        ({"current_load": -0.1}, ("current_load",)),
        ({"max_concurrency": 0}, ("max_concurrency",)),
        ({"max_concurrency": 100_001}, ("max_concurrency",)),
        ({"last_task_duration_ms": -1}, ("last_task_duration_ms",)),
        ({"consecutive_failure_count": -1}, ("consecutive_failure_count",)),
        ({"agent_id": "-a"}, ("agent_id",)),
        ({"instance_id": ""}, ("instance_id",)),
        ({"load": 0.5}, ("load",)),
    ],
)
def test_invalid_heartbeats(fields: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        HeartbeatRequest.model_validate({**BEAT, **fields})
    assert caught.value.errors()[0]["loc"] == loc


@pytest.mark.parametrize("missing", ["agent_id", "instance_id"])
def test_heartbeat_requires(missing: str) -> None:
    with pytest.raises(ValidationError) as caught:
        HeartbeatRequest.model_validate({k: v for k, v in BEAT.items() if k != missing})
    assert caught.value.errors()[0]["loc"] == (missing,)
