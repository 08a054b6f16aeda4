"""The A2A decisions (``reach.core.interop.a2a``): payload ↔ parts, what each answer means, the
fold of a stream, what a card must declare, and the skill a message names."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.interop import a2a
from reach.core.interop.a2a import State, StreamFold, Verdict


@pytest.mark.parametrize(
    ("payload", "parts"),
    [
        ({"text": "hi"}, [{"text": "hi"}]),
        ({"text": "hi", "n": 1}, [{"text": "hi"}, {"data": {"n": 1}}]),
        ({"n": 1}, [{"data": {"n": 1}}]),
        ({}, [{"data": {}}]),  # never an empty message
        ({"text": 5}, [{"data": {"text": 5}}]),  # not a string: data like the rest
    ],
)
def test_a_payload_is_a_text_part_and_one_data_part(
    payload: dict[str, Any], parts: list[dict[str, Any]]
) -> None:
    assert a2a.parts_of(payload) == parts


@pytest.mark.parametrize(
    ("parts", "payload"),
    [
        ([{"text": "a"}, {"text": "b"}], {"text": "a\nb"}),
        ([{"data": {"n": 1.0, "x": [2.0, 2.5]}}], {"n": 1, "x": [2, 2.5]}),  # protobuf floats
        ([{"data": {"a": 1}}, {"data": {"b": 2}}], {"a": 1, "b": 2}),
        ([{"data": [1, 2]}], {"data": [1, 2]}),  # not an object: under data
        ([{"url": "https://x/y.pdf"}], {}),  # files are not a reach payload
        ([{"text": "t"}, {"data": {"k": "v"}}], {"text": "t", "k": "v"}),
    ],
)
def test_parts_are_a_payload(parts: list[dict[str, Any]], payload: dict[str, Any]) -> None:
    assert a2a.payload_of(parts) == payload
    assert a2a.payload_of(a2a.parts_of(payload)) == payload  # and back


def _task(state: str, text: str = "", artifacts: list[Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state}
    if text:
        status["message"] = {"role": "ROLE_AGENT", "parts": [{"text": text}]}
    return {"id": "r-1", "status": status, "artifacts": artifacts or []}


def _ok(result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": result}


ARTIFACTS = [{"artifactId": "a", "parts": [{"text": "out"}, {"data": {"n": 2.0}}]}]


@pytest.mark.parametrize(
    ("status", "body", "kind", "envelope"),
    [
        (200, _ok({"task": _task(State.COMPLETED, artifacts=ARTIFACTS)}), "success",
         {"code": 0, "data": {"text": "out", "n": 2}}),
        (200, _ok({"message": {"parts": [{"text": "hi"}]}}), "success",
         {"code": 0, "data": {"text": "hi"}}),
        (200, _ok({"task": _task(State.FAILED, "no stock")}), "business",
         {"code": 1, "message": "A2A task failed: no stock", "a2a_state": State.FAILED.value}),
        (200, _ok({"task": _task(State.REJECTED)}), "business",
         {"code": 1, "message": "A2A task rejected", "a2a_state": State.REJECTED.value}),
        (200, _ok({"task": _task(State.CANCELED)}), "business",
         {"code": 1, "message": "A2A task cancelled", "a2a_state": State.CANCELED.value}),
        (200, _ok({"task": _task(State.WORKING)}), "working", None),
        (200, _ok({"task": _task(State.SUBMITTED)}), "working", None),
        (200, _ok({"task": _task(State.INPUT_REQUIRED, "which?")}), "waiting", None),
        (200, _ok({"task": _task(State.AUTH_REQUIRED)}), "waiting", None),
        (200, _ok(_task(State.COMPLETED)), "success", {"code": 0, "data": {}}),  # GetTask
        (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "boom"}},
         "transient", {"message": "A2A error -32603: boom"}),
        (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}},
         "business", {"code": -32602, "message": "A2A error -32602: bad"}),
        (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32009, "message": "version"}},
         "business", {"code": -32009, "message": "A2A error -32009: version"}),
        (200, {"not": "json-rpc"}, "business", None),
        (200, _ok({"neither": 1}), "business", None),
        (503, None, "http", None),  # HTTP keeps its meaning: classify decides
        (None, None, "http", None),
        (429, None, "http", None),
    ],
)  # fmt: skip
def test_each_answer_has_its_verdict(
    status: int | None, body: Any, kind: str, envelope: dict[str, Any] | None
) -> None:
    verdict = a2a.judge_response(status, body)
    assert verdict.kind == kind
    if envelope is not None and kind == "transient":
        assert verdict.status == 500 and verdict.message == envelope["message"]
    elif envelope is not None:
        assert verdict.body == envelope
    if kind in ("working", "waiting"):
        assert verdict.status == 202 and verdict.remote_task_id == "r-1"
    if kind == "waiting":
        assert verdict.message in ("which?", "")


def _event(result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": result}


def _update(state: str, text: str = "", data: dict[str, Any] | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": text}] if text else []
    if data is not None:
        parts.append({"data": data})
    status: dict[str, Any] = {"state": state}
    if parts:
        status["message"] = {"parts": parts}
    return _event({"statusUpdate": {"taskId": "r-1", "status": status}})


def test_a_stream_folds_into_progress_then_its_final_verdict() -> None:
    fold = StreamFold()
    assert fold.feed(_event({"task": {"id": "r-1", "status": {"state": State.SUBMITTED}}})) is None
    step = fold.feed(_update(State.WORKING, "step 1", {"progress": 0.5}))
    assert step is not None and (step.message, step.progress) == ("step 1", 0.5)
    assert fold.feed(_update(State.WORKING)) is None  # no message: nothing to record
    chunk = {"artifactId": "a", "parts": [{"text": "part one"}]}
    fold.feed(_event({"artifactUpdate": {"taskId": "r-1", "artifact": chunk}}))
    more = {"artifactId": "a", "parts": [{"data": {"n": 1.0}}]}
    fold.feed(_event({"artifactUpdate": {"taskId": "r-1", "artifact": more, "append": True}}))
    assert fold.final is None and fold.verdict().kind == "cut"  # ended here: follow it
    assert fold.feed(_update(State.COMPLETED)) is None
    assert fold.verdict() == Verdict(
        "success", 200, {"code": 0, "data": {"text": "part one", "n": 1}}, "r-1",
        State.COMPLETED,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("events", "kind"),
    [
        ([], "transient"),  # no task at all: the attempt failed
        ([_update(State.FAILED, "nope")], "business"),
        ([_update(State.INPUT_REQUIRED, "which?")], "waiting"),
        ([_event({"message": {"parts": [{"text": "hi"}]}})], "success"),
        ([{"jsonrpc": "2.0", "id": 1, "error": {"code": -32004, "message": "no"}}], "business"),
    ],
)
def test_how_a_stream_ends(events: list[dict[str, Any]], kind: str) -> None:
    fold = StreamFold()
    for event in events:
        fold.feed(event)
    assert fold.verdict().kind == kind


@pytest.mark.parametrize(
    ("given", "card"),
    [
        ("http://a:1", "http://a:1/.well-known/agent-card.json"),
        ("http://a:1/", "http://a:1/.well-known/agent-card.json"),
        ("http://a:1/x/card.json", "http://a:1/x/card.json"),
    ],
)
def test_the_card_url(given: str, card: str) -> None:
    assert a2a.card_url_of(given) == card


def _card(**over: Any) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": "Echo Agent",
        "version": "2",
        "supportedInterfaces": [
            {"url": "http://a:1/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text/plain"],
        "skills": [{"id": "echo", "name": "Echo", "description": "d", "tags": ["x y", "z"]}],
    }
    card.update(over)
    return card


def test_a_good_card_gives_the_facts() -> None:
    facts = a2a.card_facts(_card())
    assert (facts.name, facts.rpc_url, facts.streaming) == ("Echo Agent", "http://a:1/rpc", True)
    assert facts.capabilities == [{"type": "echo", "description": "d"}]
    assert facts.tags == ["a2a", "x-y", "z"]
    assert facts.skills[0]["input_modes"] == ["text/plain"]
    assert facts.scheme == a2a.Scheme()
    assert a2a.agent_id_of(facts.name) == "echo-agent"


BEARER = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
APIKEY = {"k": {"apiKeySecurityScheme": {"location": "header", "name": "X-Key"}}}
OAUTH = {"o": {"oauth2SecurityScheme": {}}}


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"name": ""}, "no name"),
        ({"supportedInterfaces": []}, "no JSON-RPC interface"),
        ({"supportedInterfaces": [{"url": "http://a", "protocolBinding": "GRPC",
                                    "protocolVersion": "1.0"}]}, "no JSON-RPC interface"),
        ({"supportedInterfaces": [{"url": "http://a", "protocolBinding": "JSONRPC",
                                    "protocolVersion": "0.3"}]}, "protocol version 1.x"),
        ({"supportedInterfaces": [{"url": "ftp://a", "protocolBinding": "JSONRPC",
                                    "protocolVersion": "1.0"}]}, r"not http\(s\)"),
        ({"skills": []}, "no skills"),
        ({"skills": [{"id": "bad id!"}]}, "cannot name a capability"),
        ({"skills": [{"id": "a"}, {"id": "a"}]}, "declared twice"),
        ({"securitySchemes": OAUTH, "securityRequirements": [{"schemes": {"o": {}}}]},
         "cannot present"),
    ],
)  # fmt: skip
def test_a_card_the_hub_cannot_use_is_refused_saying_why(over: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        a2a.card_facts(_card(**over))


@pytest.mark.parametrize(
    ("schemes", "required", "scheme", "headers"),
    [
        (BEARER, ["bearer"], a2a.Scheme("bearer", "bearer"), {"Authorization": "Bearer s"}),
        (APIKEY, ["k"], a2a.Scheme("apikey", "k", "X-Key"), {"X-Key": "s"}),
        ({**OAUTH, **BEARER}, ["o", "bearer"], a2a.Scheme("bearer", "bearer"),
         {"Authorization": "Bearer s"}),  # the first requirement the hub can meet
        (BEARER, [], a2a.Scheme(), {}),  # declared but not required
    ],
)  # fmt: skip
def test_the_security_scheme_the_hub_presents(
    schemes: dict[str, Any], required: list[str], scheme: a2a.Scheme, headers: dict[str, str]
) -> None:
    card = _card(
        securitySchemes=schemes,
        securityRequirements=[{"schemes": {name: {}}} for name in required],
    )
    facts = a2a.card_facts(card)
    assert facts.scheme == scheme
    assert facts.scheme.headers("s") == headers


def test_send_params_carry_the_task_id_as_message_id_and_the_skill() -> None:
    params = a2a.send_params("t-1", "echo", {"text": "hi"}, attempt_seq=2, session_id="s-1")
    message = params["message"]
    assert message["messageId"] == "t-1" and message["contextId"] == "s-1"
    assert message["metadata"] == {"skill": "echo", "reach": {"task_id": "t-1", "attempt_seq": 2}}
    assert "configuration" not in params  # blocking: the attempt's read timeout bounds it


@pytest.mark.parametrize(
    ("metadata", "skills", "expected"),
    [
        ({"skill": "b"}, ["a", "b"], "b"),
        (None, ["only"], "only"),
        ({}, ["a", "b"], ValueError("name the skill in the message's metadata.skill")),
        ({"skill": "c"}, ["a", "b"], ValueError("unknown skill 'c'")),
    ],
)
def test_the_skill_a_message_names(
    metadata: dict[str, Any] | None, skills: list[str], expected: str | ValueError
) -> None:
    if isinstance(expected, ValueError):
        with pytest.raises(ValueError, match=str(expected)) as caught:
            a2a.skill_of(metadata, skills)
        assert ", ".join(skills) in str(caught.value)
    else:
        assert a2a.skill_of(metadata, skills) == expected


def test_one_callers_message_id_is_one_task_and_never_anothers() -> None:
    assert a2a.hub_task_id("key:a", "m-1") == a2a.hub_task_id("key:a", "m-1")
    assert a2a.hub_task_id("key:a", "m-1") != a2a.hub_task_id("key:b", "m-1")
    assert a2a.hub_task_id("key:a", "m-1").startswith("a2a-")
