"""Methods and capability types are names, not paths.

The hub delivers a task by POSTing to ``{endpoint}/tasks/{method}``. A method that could
climb out of ``/tasks/`` (``x/../../admin``) would let a caller reach any path on the
agent's host, so a method -- and the capability type it names -- is a name: letters,
digits and ``. _ : -``, in parts joined by ``/`` (``doc/summarise:v2``), each part
starting with a letter or digit. No part is empty, ``.`` or ``..``: nothing a URL
normalises away. The hub checks it on every request that carries one; the Python and
Node SDKs check it before they send.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_NAME", "NAME_PATTERN", "is_path", "name_refusal"]

MAX_NAME: Final = 128
_PART = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
NAME_PATTERN: Final = rf"^{_PART}(?:/{_PART})*$"
_NAME = re.compile(NAME_PATTERN)
_ALLOWED = (
    "letters, digits and . _ : -, in parts joined by /, each part starting with a letter or digit"
)


def name_refusal(value: str, what: str = "method") -> str | None:
    """Why ``value`` is not a method name (or capability type), or None."""
    if not value:
        return f"{what} is empty"
    if len(value) > MAX_NAME:
        return f"{what} is longer than {MAX_NAME} characters"
    if _NAME.fullmatch(value):
        return None
    if is_path(value):
        return (
            f"{what} {value!r} is a path, not a name: a part that is empty, '.' or '..' "
            f"would move the delivery off /tasks/ on the agent ({_ALLOWED})"
        )
    return f"{what} {value!r} is not a name ({_ALLOWED})"


def is_path(value: str) -> bool:
    """True if ``value`` has a part a URL would normalise away or climb with (empty,
    ``.`` or ``..``): the refusal that matters most, named as such."""
    return any(part in ("", ".", "..") for part in value.split("/"))
