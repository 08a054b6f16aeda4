"""The envelope rule: what an agent's answer body means, defined once for both sides.

An agent answers ``{"code": 0, "data": ...}`` (done) or ``{"code": n, "message": ...}``
(business error n). A JSON object is an envelope exactly when its ``code`` is an int;
a bool is not (``{"code": True}`` is data, or a protocol error from the hub's side). The
SDK wraps a handler's plain return with `wrap`; delivery reads an answer with `code_of`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["code_of", "wrap"]


def code_of(body: object) -> int | None:
    """The integer ``code`` of a ``{"code": ..., ...}`` envelope, or None when there is none."""
    if not isinstance(body, dict):
        return None
    code = body.get("code")
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    return code


def wrap(value: Any) -> dict[str, Any]:
    """A handler's return as an envelope: an envelope passes through, anything else is data."""
    if code_of(value) is not None:
        return dict(value)
    return {"code": 0, "data": value}
