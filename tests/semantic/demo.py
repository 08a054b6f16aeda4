"""The demo agents' declarations, as `reach up` registers them (examples/agents/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from reach.wire.schemas import RegisterRequest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"
DEMO = ("doc_analyzer", "summarizer", "sales_agent", "knowledge_agent", "chat_agent")


def declarations(port: int = 7101) -> list[RegisterRequest]:
    """Each demo agent's registration, built by its own ``build_agent`` (nothing served)."""
    out = []
    for i, name in enumerate(DEMO):
        spec = importlib.util.spec_from_file_location(f"demo_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        agent: Any = module.build_agent(port + i, None, 5.0)
        out.append(agent.declaration)
    return out


def registration(decl: RegisterRequest, addr: str, **over: Any) -> dict[str, Any]:
    """``decl`` as a registration body from ``addr`` (a routable, non-loopback address)."""
    body = decl.model_dump(mode="json")
    body.update(addr=addr, allow_loopback=False, instance_id=f"{decl.agent_id}-i1", **over)
    return body
