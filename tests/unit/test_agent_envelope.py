"""``Agent.invoke`` without a network: the envelope, backpressure and failure counting.

Constructing an ``Agent`` does not contact the hub; these tests never call ``register``
or ``start``, so no socket is opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import reach
from reach.sdk.agent import Handler

ADDR = "10.1.2.3:7001"
TASK = {"task_id": "t-1", "payload": {"n": 1}}


class Boom(RuntimeError):
    pass


def handler_returning(value: Any) -> Handler:
    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        return value

    return handler


def handler_raising(exc: BaseException) -> Handler:
    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        raise exc

    return handler


@pytest.fixture
def agent() -> Iterator[reach.Agent]:
    a = reach.Agent("a1", addr=ADDR)
    yield a
    a.hub.close()


def with_route(agent: reach.Agent, handler: Handler, method: str = "m") -> None:
    agent.route(method)(handler)


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (handler_returning({"ok": True}), (200, {"code": 0, "data": {"ok": True}})),
        (handler_returning([1, 2]), (200, {"code": 0, "data": [1, 2]})),
        (handler_returning("text"), (200, {"code": 0, "data": "text"})),
        (handler_returning(None), (200, {"code": 0, "data": None})),
        (handler_returning(0), (200, {"code": 0, "data": 0})),
        (handler_returning({"code": 0, "data": 5}), (200, {"code": 0, "data": 5})),
        (handler_returning({"code": 3, "message": "m"}), (200, {"code": 3, "message": "m"})),
        (handler_returning({"code": -2}), (200, {"code": -2})),
        # Only an int code is an envelope; anything else is data.
        (handler_returning({"code": "3"}), (200, {"code": 0, "data": {"code": "3"}})),
        (handler_returning({"code": True}), (200, {"code": 0, "data": {"code": True}})),
        (handler_returning({"code": 1.0}), (200, {"code": 0, "data": {"code": 1.0}})),
        (handler_raising(reach.BusinessError(7, "x")), (200, {"code": 7, "message": "x"})),
        (handler_raising(reach.BusinessError(9)), (200, {"code": 9, "message": ""})),
        (handler_raising(Boom("kaput")), (500, {"code": -1, "message": "Boom: kaput"})),
        (handler_raising(KeyError("k")), (500, {"code": -1, "message": "KeyError: 'k'"})),
        (
            handler_raising(reach.AgentTimeout("slow downstream")),
            (500, {"code": -1, "message": "AgentTimeout: slow downstream"}),
        ),
    ],
)
def test_envelope(
    agent: reach.Agent, handler: Handler, expected: tuple[int, dict[str, Any]]
) -> None:
    with_route(agent, handler)
    assert agent.invoke("m", TASK) == expected
    assert agent.in_flight == 0


@pytest.mark.parametrize(
    ("method", "body", "status"),
    [
        ("other", TASK, 404),
        ("", TASK, 404),
        ("other", {}, 404),  # the method is checked before the body
        ("m", {}, 400),
        ("m", {"payload": {}}, 400),
        ("m", {"task_id": "", "payload": {}}, 400),
        ("m", {"task_id": 5, "payload": {}}, 400),
        ("m", {"task_id": None, "payload": {}}, 400),
        ("m", {"task_id": "t", "payload": [1]}, 400),
        ("m", {"task_id": "t", "payload": "p"}, 400),
        ("m", {"task_id": "t", "payload": None}, 400),
        ("m", {"task_id": "t"}, 200),  # payload defaults to {}
    ],
)
def test_refused_requests(
    agent: reach.Agent, method: str, body: dict[str, Any], status: int
) -> None:
    with_route(agent, handler_returning("ok"))
    got_status, envelope = agent.invoke(method, body)
    assert got_status == status
    assert envelope["code"] == (0 if status == 200 else status)
    if status != 200:
        assert envelope["message"]
    assert agent.in_flight == 0


def test_handler_receives_task_id_and_payload(agent: reach.Agent) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(task_id: str, payload: dict[str, Any]) -> str:
        seen.append((task_id, payload))
        return "done"

    with_route(agent, handler)
    agent.invoke("m", {"task_id": "t-9", "payload": {"a": 1}})
    agent.invoke("m", {"task_id": "t-10"})
    assert seen == [("t-9", {"a": 1}), ("t-10", {})]


def test_a_method_has_one_handler(agent: reach.Agent) -> None:
    with_route(agent, handler_returning(1))
    with pytest.raises(ValueError, match="already has a handler"):
        with_route(agent, handler_returning(2))


def test_backpressure_at_max_concurrency() -> None:
    agent = reach.Agent("a1", addr=ADDR, max_concurrency=1)
    entered = threading.Event()
    release = threading.Event()

    def slow(task_id: str, payload: dict[str, Any]) -> str:
        entered.set()
        assert release.wait(10), "test never released the handler"
        return task_id

    with_route(agent, slow)
    results: list[tuple[int, dict[str, Any]]] = []
    first = threading.Thread(target=lambda: results.append(agent.invoke("m", TASK)))
    first.start()
    try:
        assert entered.wait(10)
        assert agent.in_flight == 1
        assert agent.invoke("m", {"task_id": "t-2", "payload": {}}) == (
            429,
            {"code": 429, "message": "agent at max_concurrency"},
        )
        # A refusal is not a failure and does not take a slot.
        assert agent.in_flight == 1
        assert agent.runner.consecutive_failures == 0
    finally:
        release.set()
        first.join(10)
        agent.hub.close()
    assert not first.is_alive()
    assert results == [(200, {"code": 0, "data": "t-1"})]
    assert agent.in_flight == 0
    # The slot is free again.
    assert agent.invoke("m", {"task_id": "t-3", "payload": {}}) == (
        200,
        {"code": 0, "data": "t-3"},
    )


@pytest.mark.parametrize(
    ("outcomes", "expected_counts"),
    [
        ("FFF", [1, 2, 3]),
        ("FFOF", [1, 2, 0, 1]),
        ("OOO", [0, 0, 0]),
        ("FBF", [1, 0, 1]),  # a business error is an answer, not a failure
        ("FDF", [1, 0, 1]),  # so is a dict with its own code
    ],
)
def test_consecutive_failures(
    agent: reach.Agent, outcomes: str, expected_counts: list[int]
) -> None:
    script = iter(outcomes)

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        step = next(script)
        if step == "F":
            raise Boom("fail")
        if step == "B":
            raise reach.BusinessError(3, "no")
        if step == "D":
            return {"code": 4, "message": "no"}
        return "ok"

    with_route(agent, handler)
    counts = []
    for n, _ in enumerate(outcomes):
        agent.invoke("m", {"task_id": f"t-{n}", "payload": {}})
        counts.append(agent.runner.consecutive_failures)
        assert agent.in_flight == 0
    assert counts == expected_counts


def test_refusals_do_not_touch_the_failure_count(agent: reach.Agent) -> None:
    with_route(agent, handler_raising(Boom("x")))
    agent.invoke("m", TASK)
    assert agent.runner.consecutive_failures == 1
    agent.invoke("m", TASK)  # a transient failure is not remembered: the retry runs again
    assert agent.runner.consecutive_failures == 2
    agent.invoke("nope", TASK)
    agent.invoke("m", {})
    assert agent.runner.consecutive_failures == 2


# -- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "public_endpoint"),
    [
        ("127.0.0.1:7001", None),
        ("localhost:7001", None),
        ("[::1]:7001", None),
        ("http://127.0.0.5:7001/agent", None),
        ("api.localhost:7001", None),
        ("10.1.2.3:7001", "http://127.0.0.1:7001"),
    ],
)
def test_loopback_addr_is_refused(addr: str, public_endpoint: str | None) -> None:
    with pytest.raises(reach.LoopbackAddress, match="loopback"):
        reach.Agent("a1", addr=addr, public_endpoint=public_endpoint)


@pytest.mark.parametrize(
    ("addr", "public_endpoint", "allow_loopback"),
    [
        ("127.0.0.1:7001", None, True),
        ("localhost:7001", None, True),
        ("[::1]:7001", None, True),
        # Bind on loopback behind a routable public endpoint: the hub reaches the latter.
        ("127.0.0.1:7001", "http://10.1.2.3:7001", False),
        ("10.1.2.3:7001", None, False),
    ],
)
def test_addresses_accepted(addr: str, public_endpoint: str | None, allow_loopback: bool) -> None:
    agent = reach.Agent(
        "a1", addr=addr, public_endpoint=public_endpoint, allow_loopback=allow_loopback
    )
    try:
        assert agent.declaration.allow_loopback is allow_loopback
        assert agent.in_flight == 0
    finally:
        agent.hub.close()


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"capabilities": [{"type": "bad type"}]}, "type"),
        ({"capabilities": [{"type": "x", "params_schema": {"type": "nope"}}]}, "params_schema"),
        ({"capabilities": [{"type": "x", "danger_level": "extreme"}]}, "danger_level"),
        ({"capabilities": [{"type": "x"}, {"type": "x"}]}, "declared twice"),
        ({"capabilities": [{"type": "x", "colour": "red"}]}, "colour"),
        ({"agent_id": "-bad"}, "agent_id"),
        ({"tags": ["a", "a"]}, "tags"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"addr": "10.1.2.3"}, "addr"),
        ({"public_endpoint": "ftp://10.1.2.3:21"}, "public_endpoint"),
    ],
)
def test_bad_declaration_raises_invalid_registration(kwargs: dict[str, Any], where: str) -> None:
    args: dict[str, Any] = {"agent_id": "a1", "addr": ADDR, **kwargs}
    with pytest.raises(reach.InvalidRegistration, match=where):
        reach.Agent(**args)


def test_bad_capability_error_says_which_capability() -> None:
    with pytest.raises(reach.InvalidRegistration, match=r"capabilities\.1\.type"):
        reach.Agent("a1", addr=ADDR, capabilities=[{"type": "ok"}, {"type": "bad type"}])


def test_capability_objects_and_mappings_are_both_accepted() -> None:
    agent = reach.Agent(
        "a1",
        addr=ADDR,
        capabilities=[reach.Capability(type="a"), {"type": "b", "danger_level": "high"}],
    )
    try:
        assert [c.type for c in agent.declaration.capabilities] == ["a", "b"]
        assert agent.declaration.capabilities[1].danger_level == "high"
    finally:
        agent.hub.close()


# -- the idempotency guard: a redelivered task returns the stored answer ---------------------


def test_redelivery_returns_the_stored_answer_without_running_again(agent: reach.Agent) -> None:
    runs: list[str] = []

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        runs.append(task_id)
        return {"n": len(runs)}

    with_route(agent, handler)
    first = agent.invoke("m", {"task_id": "dup", "payload": {}, "attempt_seq": 1})
    second = agent.invoke("m", {"task_id": "dup", "payload": {}, "attempt_seq": 2})
    assert first == second == (200, {"code": 0, "data": {"n": 1}})
    assert runs == ["dup"]


def test_business_errors_are_remembered_too(agent: reach.Agent) -> None:
    runs: list[str] = []

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        runs.append(task_id)
        raise reach.BusinessError(7, "unsupported")

    with_route(agent, handler)
    assert (
        agent.invoke("m", TASK)
        == agent.invoke("m", TASK)
        == (200, {"code": 7, "message": "unsupported"})
    )
    assert runs == ["t-1"]


def test_concurrent_duplicate_waits_for_the_first_copy(agent: reach.Agent) -> None:
    release = threading.Event()
    runs: list[str] = []

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        runs.append(task_id)
        release.wait(5)
        return "once"

    with_route(agent, handler)
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(agent.invoke("m", TASK)))
    first.start()
    while not runs:
        time.sleep(0.001)
    second = threading.Thread(target=lambda: answers.append(agent.invoke("m", TASK)))
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert answers == [(200, {"code": 0, "data": "once"})] * 2
    assert runs == ["t-1"]


def test_accepted_answers_202_and_redelivery_does_not_rerun(agent: reach.Agent) -> None:
    runs: list[str] = []

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        runs.append(task_id)
        return reach.ACCEPTED

    with_route(agent, handler)
    assert agent.invoke("m", TASK)[0] == 202
    assert agent.invoke("m", TASK)[0] == 202
    assert runs == ["t-1"]


def test_handler_sees_its_trace_and_nested_sends_continue_it(agent: reach.Agent) -> None:
    from reach.sdk import trace

    seen: list[Any] = []

    def handler(task_id: str, payload: dict[str, Any]) -> Any:
        seen.append(trace.child_of(trace.current()))
        return None

    with_route(agent, handler)
    agent.invoke(
        "m",
        {
            "task_id": "t-9",
            "payload": {},
            "trace": {"root_id": "root-1", "hops": 2, "path": ["caller"]},
        },
    )
    assert seen == [
        {
            "root_id": "root-1",
            "parent_task_id": "t-9",
            "hops": 3,
            "path": ["caller", agent.agent_id],
        }
    ]
    assert trace.current() is None  # nothing leaks out of the handler


def test_answers_leave_without_waiting_for_nagle(agent: reach.Agent) -> None:
    """Headers and body go out in two writes; with Nagle's algorithm on, the body waits
    for the hub's delayed ACK and every keep-alive delivery costs ~40 ms. The handler
    sets TCP_NODELAY on each accepted connection (StreamRequestHandler's switch)."""
    from reach.sdk.agent import _make_request_handler

    assert _make_request_handler(agent).disable_nagle_algorithm is True
