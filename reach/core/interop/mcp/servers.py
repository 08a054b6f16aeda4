"""An MCP server as an agent: its tools as capabilities, a tool's result as an outcome, and
what a re-read tool list may change (pure; the wire is ``reach.hub.interop.mcp.client``).

A tool is a capability of the same name: its description, and its ``inputSchema`` as the
``params_schema`` the hub validates a payload against before the call. A tool whose name
is not a capability name (``reach.core.fleet.names``) is left out and said so.

A ``tools/call`` result is the envelope an SDK agent would have sent: ``isError`` is a
business error whose message is the result's text; otherwise the ``structuredContent``
(or the text and other content, when there is none) is the data.

The tool list is read again on a schedule with no admin at hand, so it may not take over
capabilities silently (issue 37: no squatting): a tool that is new to the registration and
that another agent declares at the same or a higher trust level is *held* (not declared,
and raised as an alert) until an admin registers the server again. Tools gone from the
list are removed; tools that stay, stay.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from reach.core.fleet.names import name_refusal

__all__ = [
    "BUSINESS_CODE",
    "PROTOCOL",
    "RefreshPlan",
    "agent_id_of",
    "capabilities_of",
    "capability_of",
    "envelope_of",
    "progress_fraction",
    "refresh_plan",
    "rpc_error_envelope",
    "text_of",
    "trust_rank",
]

PROTOCOL: Final = "mcp"  # instances.protocol of an instance reached over MCP
BUSINESS_CODE: Final = 1  # the code of a tool call that answered isError
MAX_DESCRIPTION: Final = 2000
MAX_MESSAGE: Final = 2000
_TRUST_RANK: Final = {"L1": 3, "L2": 2, "L3": 1}


def capability_of(tool: Mapping[str, Any]) -> dict[str, Any] | str:
    """The capability a listed tool declares, or why it cannot be one."""
    name = tool.get("name")
    if not isinstance(name, str):
        return "the tool has no name"
    refused = name_refusal(name, "tool name")
    if refused is not None:
        return refused
    schema = tool.get("inputSchema")
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        return f"tool {name!r} has an inputSchema that is not a JSON object"
    description = tool.get("description") or tool.get("title") or ""
    return {
        "type": name,
        "description": str(description)[:MAX_DESCRIPTION],
        "params_schema": schema,
    }


def capabilities_of(
    tools: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The capabilities of a tool list, in its order, and the tools left out (name: why);
    a name listed twice is declared once."""
    declared: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    seen: set[str] = set()
    for tool in tools:
        cap = capability_of(tool)
        if isinstance(cap, str):
            skipped[str(tool.get("name") or "?")] = cap
        elif cap["type"] in seen:
            skipped[cap["type"]] = "listed twice"
        else:
            seen.add(cap["type"])
            declared.append(cap)
    return declared, skipped


def text_of(content: Any) -> str:
    """The text blocks of a result's ``content``, joined."""
    if not isinstance(content, list):
        return ""
    texts = [
        str(block.get("text", ""))
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    return "\n".join(t for t in texts if t)


def envelope_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``tools/call`` result means, as an SDK agent's envelope."""
    if result.get("isError"):
        said = text_of(result.get("content")) or "the tool reported an error"
        return {"code": BUSINESS_CODE, "message": said[:MAX_MESSAGE]}
    structured = result.get("structuredContent")
    if structured is not None:
        return {"code": 0, "data": structured}
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    data: dict[str, Any] = {"text": text_of(blocks)}
    others = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "text")]
    if others:
        data["content"] = others
    return {"code": 0, "data": data}


# JSON-RPC errors that say nothing about the call itself: the connection closed, the
# request timed out, the server failed inside (as HTTP's 5xx): asked again, it may succeed
TRANSIENT_RPC_CODES: Final = frozenset({-32000, -32001, -32603})


def rpc_error_envelope(code: int, message: str) -> dict[str, Any] | None:
    """A JSON-RPC error answering ``tools/call``: the business error it is (the server
    refused this call: unknown tool, bad arguments ...), or None when it is transient."""
    if code in TRANSIENT_RPC_CODES:
        return None
    said = f"the MCP server refused the call ({code}): {message}"
    return {"code": BUSINESS_CODE, "message": said[:MAX_MESSAGE]}


def progress_fraction(progress: float, total: float | None) -> float | None:
    """A progress notification as a fraction in [0, 1] (None: no total to divide by)."""
    if total is None or total <= 0:
        return None
    return max(0.0, min(1.0, progress / total))


def trust_rank(level: str) -> int:
    """L1 above L2 above L3 (an unknown level ranks lowest)."""
    return _TRUST_RANK.get(level, 0)


@dataclass(frozen=True, slots=True)
class RefreshPlan:
    """What a re-read tool list changes: the capability types declared after it, those it
    adds and removes, and the new ones held back (type: the agent that owns it)."""

    declared: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    held: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def refresh_plan(
    registered: Sequence[str],
    listed: Sequence[str],
    owners: Mapping[str, Sequence[tuple[str, str]]],
    own_trust: str,
) -> RefreshPlan:
    """What the server's re-read tool list (``listed``, capability types in list order) may
    change of its registration (``registered``). ``owners``: for a type, the other agents
    that declare it, with their trust levels. A new type owned by another agent at the
    same or a higher trust is held: a peer's or a better-trusted agent's reaches are not
    split with a server that just started listing the tool."""
    before = set(registered)
    held: dict[str, str] = {}
    declared: list[str] = []
    for kind in listed:
        if kind not in before:
            rivals = sorted(
                (
                    agent
                    for agent, trust in owners.get(kind, ())
                    if trust_rank(trust) >= trust_rank(own_trust)
                )
            )
            if rivals:
                held[kind] = rivals[0]
                continue
        declared.append(kind)
    now = set(declared)
    return RefreshPlan(
        tuple(declared),
        tuple(k for k in declared if k not in before),
        tuple(k for k in registered if k not in now),
        held,
    )


def agent_id_of(name: str) -> str:
    """An agent ID from the server's name when the admin gives none: ``Tool Server`` →
    ``tool-server``."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:120]
    return slug or "mcp-server"
