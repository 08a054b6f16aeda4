"""The Agent2Agent protocol (A2A 1.0) as pure decisions on its JSON form.

Both directions of the hub's A2A interop map between a reach (``method`` + ``payload`` →
``data``) and an A2A exchange (a skill, a message of parts → a task with artifacts). The
hub's edges parse and validate with ``a2a-sdk``'s types; what is decided here works on the
canonical JSON those types print (camelCase, enum names), so it is table-tested without
sockets and ``reach.core`` stays free of the SDK.

Payload mapping, both ways: ``payload["text"]`` is one text part, the rest of the payload
one data part; a result's ``data`` holds the artifacts' text (``data["text"]``, parts
joined by newlines) and their data parts merged.

An answer of an A2A agent (a ``SendMessage`` result, a ``GetTask`` task, the last event of
a stream) becomes a `Verdict`, whose ``envelope`` is what an SDK agent would have answered
(``reach.core.delivery.retry.classify`` then decides as for any agent):

====================================  ==========  ====================================
A2A answer                            verdict     envelope
====================================  ==========  ====================================
task COMPLETED, or a message          success     200 ``{"code": 0, "data": ...}``
task FAILED / REJECTED / CANCELED     business    200 ``{"code": 1, "message": ...}``
task SUBMITTED / WORKING              working     202 (followed with GetTask)
task INPUT_REQUIRED / AUTH_REQUIRED   waiting     202 (the task is ``waiting``)
JSON-RPC error -32603 (internal)      transient   500 (retried)
any other JSON-RPC error              business    200 ``{"code": <its code>, ...}``
not JSON-RPC at all                   business    200 (a protocol error: no retry helps)
====================================  ==========  ====================================
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = [
    "A2A_VERSION",
    "BUSINESS_CODE",
    "JSONRPC_BINDING",
    "METHOD_SEND",
    "WELL_KNOWN_CARD",
    "CardFacts",
    "Progress",
    "Scheme",
    "State",
    "StreamFold",
    "Verdict",
    "card_facts",
    "card_url_of",
    "data_of_parts",
    "hub_task_id",
    "judge_response",
    "judge_task",
    "origin_of",
    "parts_of",
    "payload_of",
    "send_params",
    "skill_of",
    "state_of_status",
    "text_of",
]

A2A_VERSION: Final = "1.0"
WELL_KNOWN_CARD: Final = "/.well-known/agent-card.json"
JSONRPC_BINDING: Final = "JSONRPC"
METHOD_SEND: Final = "SendMessage"
METHOD_STREAM: Final = "SendStreamingMessage"
METHOD_GET: Final = "GetTask"
BUSINESS_CODE: Final = 1  # the code of an A2A task that failed, was rejected or cancelled
INTERNAL_ERROR: Final = -32603
_CAPABILITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_TAG = re.compile(r"[^A-Za-z0-9._:/-]+")


class State(StrEnum):
    """A2A task states (their JSON names) and what each means to the hub."""

    UNSPECIFIED = "TASK_STATE_UNSPECIFIED"
    SUBMITTED = "TASK_STATE_SUBMITTED"
    WORKING = "TASK_STATE_WORKING"
    COMPLETED = "TASK_STATE_COMPLETED"
    FAILED = "TASK_STATE_FAILED"
    CANCELED = "TASK_STATE_CANCELED"
    INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
    REJECTED = "TASK_STATE_REJECTED"
    AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"


FAILING: Final = frozenset({State.FAILED, State.REJECTED, State.CANCELED})
WAITING: Final = frozenset({State.INPUT_REQUIRED, State.AUTH_REQUIRED})
FINAL: Final = FAILING | WAITING | {State.COMPLETED}
"""States after which a stream ends: terminal ones, and the interrupted (waiting) ones."""


# -- payload <-> parts --------------------------------------------------------------------


def parts_of(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A reach payload as message parts: its ``text`` (a string) as a text part, the rest
    as one data part (always at least one part: an empty payload is an empty data part)."""
    text = payload.get("text")
    rest = {k: v for k, v in payload.items() if k != "text" or not isinstance(v, str)}
    parts: list[dict[str, Any]] = []
    if isinstance(text, str):
        parts.append({"text": text})
    if rest or not parts:
        parts.append({"data": rest})
    return parts


def payload_of(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Message parts as a reach payload: text parts joined as ``text``, object data parts
    merged in (another JSON value goes under ``data``); files are not a reach payload."""
    return data_of_parts(parts)


def data_of_parts(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    texts: list[str] = []
    data: dict[str, Any] = {}
    for part in parts:
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            value = integral(part["data"])
            if isinstance(value, dict):
                data.update(value)
            else:
                data["data"] = value
    if texts:
        data["text"] = "\n".join(texts)
    return data


def text_of(message: Mapping[str, Any] | None) -> str:
    """The text parts of a message (a status message, say), joined."""
    if not message:
        return ""
    return "\n".join(
        p["text"] for p in message.get("parts") or () if isinstance(p.get("text"), str)
    )


def integral(value: Any) -> Any:
    """JSON numbers as protobuf's ``Value`` prints them (every one a float) back to ints
    where they are whole, so ``{"n": 1}`` survives a round trip through an A2A peer."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value


def result_of(task: Mapping[str, Any]) -> dict[str, Any]:
    """A completed task's ``data``: its artifacts' parts (``data_of_parts``)."""
    parts = [p for a in task.get("artifacts") or () for p in a.get("parts") or ()]
    return data_of_parts(parts)


# -- requests -----------------------------------------------------------------------------


def send_params(
    task_id: str,
    method: str,
    payload: Mapping[str, Any],
    *,
    attempt_seq: int,
    session_id: str | None = None,
    return_immediately: bool = False,
) -> dict[str, Any]:
    """``SendMessage`` params for one attempt: the hub's ``task_id`` is the message ID (an
    agent that dedups on message IDs sees every attempt of a task as one message), the
    skill rides in ``metadata.skill``, and the session, when there is one, is the context."""
    message: dict[str, Any] = {
        "messageId": task_id,
        "role": "ROLE_USER",
        "parts": parts_of(payload),
        "metadata": {"skill": method, "reach": {"task_id": task_id, "attempt_seq": attempt_seq}},
    }
    if session_id:
        message["contextId"] = session_id
    params: dict[str, Any] = {"message": message}
    if return_immediately:
        params["configuration"] = {"returnImmediately": True}
    return params


def rpc(method: str, params: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}


# -- answers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an A2A answer means: ``kind`` is success / business / working / waiting /
    transient; ``status`` and ``body`` are the envelope an SDK agent would have sent."""

    kind: str
    status: int | None
    body: Any
    remote_task_id: str | None = None
    state: str | None = None
    message: str = ""


def state_of_status(status: Mapping[str, Any] | None) -> State:
    raw = (status or {}).get("state") or State.UNSPECIFIED.value
    try:
        return State(raw)
    except ValueError:
        return State.UNSPECIFIED


def judge_task(task: Mapping[str, Any]) -> Verdict:
    """A task (from SendMessage, GetTask or the end of a stream) by its state."""
    state = state_of_status(task.get("status"))
    remote = str(task.get("id") or "") or None
    said = text_of((task.get("status") or {}).get("message"))
    if state is State.COMPLETED:
        return Verdict("success", 200, {"code": 0, "data": result_of(task)}, remote, state)
    if state in FAILING:
        word = {State.FAILED: "failed", State.REJECTED: "rejected", State.CANCELED: "cancelled"}
        message = f"A2A task {word[state]}" + (f": {said}" if said else "")
        body = {"code": BUSINESS_CODE, "message": message, "a2a_state": state.value}
        return Verdict("business", 200, body, remote, state, message)
    if state in WAITING:
        return Verdict("waiting", 202, None, remote, state, said)
    return Verdict("working", 202, None, remote, state, said)


def judge_response(status: int | None, body: Any) -> Verdict:
    """A JSON-RPC answer over HTTP. Non-200 statuses keep their HTTP meaning (5xx and no
    answer transient, 429 backpressure, 401 refused) and are left to ``classify``."""
    if status is None or status != 200:
        return Verdict("http", status, body)
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        message = "the A2A agent did not answer JSON-RPC 2.0"
        return Verdict("business", 200, {"code": BUSINESS_CODE, "message": message})
    error = body.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else BUSINESS_CODE
        message = f"A2A error {code}: {error.get('message') or ''}".rstrip(": ")
        if code == INTERNAL_ERROR:
            return Verdict("transient", 500, {"error": message}, message=message)
        return Verdict("business", 200, {"code": code, "message": message}, message=message)
    result = body.get("result")
    if isinstance(result, dict) and isinstance(result.get("message"), dict):
        parts = result["message"].get("parts") or ()
        return Verdict("success", 200, {"code": 0, "data": data_of_parts(parts)})
    if isinstance(result, dict) and isinstance(result.get("task"), dict):
        return judge_task(result["task"])
    if isinstance(result, dict) and "status" in result and "id" in result:
        return judge_task(result)  # GetTask answers the task itself
    message = "the A2A agent's answer holds neither a task nor a message"
    return Verdict("business", 200, {"code": BUSINESS_CODE, "message": message})


@dataclass(frozen=True, slots=True)
class Progress:
    """A status update worth a progress event: its text, data parts and state."""

    message: str
    data: dict[str, Any] | None
    state: str
    progress: float | None = None


@dataclass(slots=True)
class StreamFold:
    """Folds the events of ``SendStreamingMessage`` into the task they describe.

    ``feed`` takes one JSON-RPC event (its ``result``: task, message, statusUpdate or
    artifactUpdate) and returns the progress to record, if any; ``verdict`` says what the
    stream amounted to when it ended (a stream that ended on no final state was cut:
    transient, so the attempt is retried).
    """

    task: dict[str, Any] = field(default_factory=dict)
    final: Verdict | None = None
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def feed(self, event: Mapping[str, Any]) -> Progress | None:
        if isinstance(event.get("error"), dict):
            self.final = judge_response(200, dict(event))
            return None
        result = event.get("result")
        if not isinstance(result, dict):
            return None
        if isinstance(result.get("message"), dict):
            self.final = judge_response(200, {"jsonrpc": "2.0", "result": result})
            return None
        if isinstance(result.get("task"), dict):
            self.task = dict(result["task"])
            for artifact in self.task.get("artifacts") or ():
                self.artifacts[str(artifact.get("artifactId", ""))] = dict(artifact)
            return self._status(self.task.get("status"))
        if isinstance(result.get("artifactUpdate"), dict):
            update = result["artifactUpdate"]
            artifact = dict(update.get("artifact") or {})
            key = str(artifact.get("artifactId", ""))
            held = self.artifacts.get(key)
            if update.get("append") and held is not None:
                held["parts"] = [*(held.get("parts") or ()), *(artifact.get("parts") or ())]
            else:
                self.artifacts[key] = artifact
            return None
        if isinstance(result.get("statusUpdate"), dict):
            update = result["statusUpdate"]
            self.task.setdefault("id", update.get("taskId"))
            self.task["status"] = update.get("status") or {}
            return self._status(update.get("status"))
        return None

    def _status(self, status: Mapping[str, Any] | None) -> Progress | None:
        state = state_of_status(status)
        if state in FINAL:
            self.final = judge_task({**self.task, "artifacts": list(self.artifacts.values())})
            return None
        message = (status or {}).get("message")
        if not message:
            return None
        data = data_of_parts(p for p in message.get("parts") or () if "data" in p) or None
        fraction = data.get("progress") if data else None
        progress = (
            float(fraction)
            if isinstance(fraction, int | float)
            and not isinstance(fraction, bool)
            and 0 <= fraction <= 1
            else None
        )
        return Progress(text_of(message), data, state.value, progress)

    @property
    def remote_task_id(self) -> str | None:
        value = self.task.get("id")
        return str(value) if value else None

    def verdict(self) -> Verdict:
        if self.final is not None:
            return self.final
        if self.task.get("status") is not None and self.remote_task_id is not None:
            return Verdict("cut", None, None, self.remote_task_id, message="stream ended early")
        return Verdict("transient", None, None, message="the A2A stream ended without a task")


# -- cards --------------------------------------------------------------------------------


def card_url_of(url: str) -> str:
    """The card's URL from what a user gives: the agent's base URL, or the card's own."""
    if urlsplit(url).path.endswith(".json"):
        return url
    return url.rstrip("/") + WELL_KNOWN_CARD


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``, the port spelt out: where the hub presents an A2A
    agent's credential. It is bound to the origin of the JSON-RPC URL the card named when
    an admin gave it, and never follows the agent anywhere else (issue 37)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme.lower()}://{shown}:{port}"


@dataclass(frozen=True, slots=True)
class Scheme:
    """How the hub authenticates to an A2A agent: ``none``, ``bearer`` or ``apikey`` (a
    header of the card's naming)."""

    kind: str = "none"
    name: str = ""  # the card's name for the scheme
    header: str = ""  # apikey: the header to carry the secret in

    def headers(self, credential: str | None) -> dict[str, str]:
        if self.kind == "bearer" and credential:
            return {"Authorization": f"Bearer {credential}"}
        if self.kind == "apikey" and credential:
            return {self.header: credential}
        return {}


@dataclass(frozen=True, slots=True)
class CardFacts:
    """What the hub takes from a valid card: where to call it and what it can do."""

    name: str
    rpc_url: str
    streaming: bool
    scheme: Scheme
    capabilities: list[dict[str, Any]]
    tags: list[str]
    skills: list[dict[str, Any]]
    version: str


def _scheme_of(card: Mapping[str, Any]) -> Scheme:
    """The first security requirement the hub can meet (bearer, or an API key in a
    header); ValueError naming what the card asks for when none."""
    requirements = card.get("securityRequirements") or []
    if not requirements:
        return Scheme()
    schemes = card.get("securitySchemes") or {}
    asked: list[str] = []
    for requirement in requirements:
        names = list((requirement.get("schemes") or {}).keys())
        if len(names) != 1:
            asked.append(" + ".join(names) or "(empty)")
            continue
        name = names[0]
        scheme = schemes.get(name) or {}
        http = scheme.get("httpAuthSecurityScheme")
        if isinstance(http, dict) and str(http.get("scheme", "")).lower() == "bearer":
            return Scheme("bearer", name)
        key = scheme.get("apiKeySecurityScheme")
        if isinstance(key, dict) and key.get("location") == "header" and key.get("name"):
            return Scheme("apikey", name, str(key["name"]))
        asked.append(f"{name} ({', '.join(scheme) or 'undeclared'})")
    raise ValueError(
        "the card requires security the hub cannot present (it speaks HTTP bearer and API "
        f"keys in a header): {'; '.join(asked)}"
    )


def card_facts(card: Mapping[str, Any]) -> CardFacts:
    """Check a card (its canonical JSON) for what the hub needs; ValueError saying what is
    missing otherwise: a JSON-RPC interface of protocol 1.x, skills with IDs the hub can
    name as capabilities, and a security scheme it can present."""
    name = str(card.get("name") or "").strip()
    if not name:
        raise ValueError("the card has no name")
    rpc_url = None
    for interface in card.get("supportedInterfaces") or ():
        version = str(interface.get("protocolVersion") or "")
        if interface.get("protocolBinding") == JSONRPC_BINDING and version.split(".")[0] == "1":
            rpc_url = str(interface.get("url") or "")
            break
    if not rpc_url:
        raise ValueError(
            "the card declares no JSON-RPC interface of protocol version 1.x "
            "(supportedInterfaces[].protocolBinding JSONRPC, protocolVersion 1.0)"
        )
    if urlsplit(rpc_url).scheme not in ("http", "https"):
        raise ValueError(f"the card's JSON-RPC URL is not http(s): {rpc_url!r}")
    skills = list(card.get("skills") or ())
    if not skills:
        raise ValueError("the card declares no skills: nothing to reach it for")
    capabilities: list[dict[str, Any]] = []
    tags: set[str] = {"a2a"}
    kept: list[dict[str, Any]] = []
    seen: set[str] = set()
    for skill in skills:
        sid = str(skill.get("id") or "")
        if not _CAPABILITY.match(sid):
            raise ValueError(
                f"skill id {sid!r} cannot name a capability "
                "(letters, digits and . _ : / -, at most 128, starting alphanumeric)"
            )
        if sid in seen:
            raise ValueError(f"skill id {sid!r} is declared twice")
        seen.add(sid)
        description = str(skill.get("description") or skill.get("name") or "")[:2000]
        capabilities.append({"type": sid, "description": description})
        skill_tags = [t for t in (_tag(raw) for raw in skill.get("tags") or ()) if t]
        tags.update(skill_tags)
        kept.append(
            {
                "id": sid,
                "name": str(skill.get("name") or sid),
                "description": description,
                "tags": skill_tags,
                "input_modes": list(skill.get("inputModes") or card.get("defaultInputModes") or ()),
                "output_modes": list(
                    skill.get("outputModes") or card.get("defaultOutputModes") or ()
                ),
            }
        )
    return CardFacts(
        name=name,
        rpc_url=rpc_url,
        streaming=bool((card.get("capabilities") or {}).get("streaming")),
        scheme=_scheme_of(card),
        capabilities=capabilities,
        tags=sorted(tags)[:64],
        skills=kept,
        version=str(card.get("version") or "")[:64],
    )


def _tag(raw: object) -> str:
    """A skill tag as a hub tag (its pattern), or "" when nothing of it is left."""
    tag = _TAG.sub("-", str(raw).strip()).strip("-._:/")[:64]
    return tag if tag and tag[0].isalnum() else ""


def agent_id_of(name: str) -> str:
    """An agent ID from a card's name when the user gives none: ``Echo Agent`` → ``echo-agent``."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:120]
    return slug or "a2a-agent"


# -- the hub as an A2A server -------------------------------------------------------------


def skill_of(metadata: Mapping[str, Any] | None, skills: list[str]) -> str:
    """The skill a message names (``metadata.skill``), or the only one there is; ValueError
    listing the skills otherwise."""
    named = (metadata or {}).get("skill")
    if isinstance(named, str) and named:
        if named not in skills:
            raise ValueError(f"unknown skill {named!r}; this agent's skills: {', '.join(skills)}")
        return named
    if len(skills) == 1:
        return skills[0]
    raise ValueError(
        "name the skill in the message's metadata.skill; this agent's skills: " + ", ".join(skills)
    )


def hub_task_id(caller: str, message_id: str) -> str:
    """The hub's task for an A2A message: the same caller resending the same message ID
    reaches the same task (submission is idempotent on it); another caller never does."""
    digest = hashlib.sha256(f"{caller}\x00{message_id}".encode()).hexdigest()[:32]
    return f"a2a-{digest}"


HUB_STATE: Final[Mapping[str, State]] = {
    "pending": State.SUBMITTED,
    "awaiting_approval": State.SUBMITTED,
    "dispatching": State.WORKING,
    "executing": State.WORKING,
    "waiting": State.INPUT_REQUIRED,
    "success": State.COMPLETED,
    "failed": State.FAILED,
    "dead": State.FAILED,
    "cancelled": State.CANCELED,
}
"""A hub task's status as the A2A state an A2A client sees."""


def artifact_parts(result: Any) -> list[dict[str, Any]]:
    """A hub result as artifact parts: ``text`` as a text part, the rest as a data part."""
    if isinstance(result, dict):
        return parts_of(result)
    return [{"data": {"data": result}}] if result is not None else []
