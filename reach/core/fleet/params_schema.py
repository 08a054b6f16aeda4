"""A capability's ``params_schema``: what the hub accepts at registration, and how a payload
is judged against it.

A schema is data an agent key sends, so it is judged as hostile input (issue 37):

* No remote retrieval. A ``$ref`` (or ``$dynamicRef``) must point inside the schema
  (``#...``): one naming another document is refused at registration, and validation
  runs offline, so a schema stored before this rule fetches nothing either (its
  payloads are refused with the reason).
* Linear-time patterns. ``pattern`` and ``patternProperties`` are compiled by
  ``jsonschema-rs`` with its standard regex engine (`RegexOptions`), whose matching time
  grows linearly with the input: a pattern such as ``^(a+)+$`` cannot stall a process.
  Patterns that need backtracking (lookaround, backreferences) are refused at
  registration with the reason, and so is a pattern whose compiled form passes
  `MAX_REGEX_BYTES`.

Pure: no I/O (validation is offline), no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import jsonschema_rs

# ``jsonschema_rs`` is imported by the functions that validate, with the first schema used:
# a worker whose agents declare none never holds it (~6 MB a process).

__all__ = ["MAX_REGEX_BYTES", "payload_error", "refusal"]

MAX_REGEX_BYTES: Final = 1 << 20
"""The compiled size a schema's pattern may reach (and its matcher's DFA cache)."""

_REF_KEYS: Final = ("$ref", "$dynamicRef", "$recursiveRef")


def refusal(schema: dict[str, Any]) -> str | None:
    """Why the hub refuses ``schema`` as a ``params_schema`` (or any schema it validates
    with), or None: a reference to another document, or a pattern the linear-time engine
    cannot compile (lookaround, backreferences, too large)."""
    for where, ref in _refs(schema, ""):
        if not ref.startswith("#"):
            return (
                f"{where or '<root>'}: {ref!r} names another document; the hub retrieves "
                "nothing, so a schema may only refer inside itself ('#/$defs/...')"
            )
    import jsonschema_rs

    try:
        _build(json.dumps(schema, sort_keys=True))
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"{first} (patterns must suit a linear-time regex engine: no lookaround or "
            "backreferences)"
        )
    return None


def payload_error(schema: dict[str, Any], payload: Any) -> str | None:
    """The first way ``payload`` fails ``schema`` ("<path>: <message>"), or None when it
    satisfies it. A schema the hub cannot use (stored before `refusal` held) fails every
    payload, with the reason: a gate the hub cannot evaluate is closed, never open. The
    empty schema (no ``params_schema`` declared) accepts every payload, as JSON Schema says,
    without a validator."""
    if not schema:
        return None
    import jsonschema_rs

    try:
        validator = _build(json.dumps(schema, sort_keys=True))
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"<schema>: the capability's params_schema cannot be used: {first}"
    error = next(iter(validator.iter_errors(payload)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.instance_path) or "<payload>"
    return f"{where}: {error.message}"


@lru_cache(maxsize=256)
def _build(schema_json: str) -> jsonschema_rs.Validator:
    """Compiled once per distinct schema: building a validator costs more than using it."""
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(
        json.loads(schema_json),
        offline=True,  # never retrieve a document over the network
        pattern_options=jsonschema_rs.RegexOptions(
            size_limit=MAX_REGEX_BYTES, dfa_size_limit=MAX_REGEX_BYTES
        ),
    )


def _refs(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every reference keyword's value in the schema, with where it sits."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}/{key}"
            if key in _REF_KEYS and isinstance(value, str):
                yield path, value
            else:
                yield from _refs(value, path)
    elif isinstance(node, list):
        for n, value in enumerate(node):
            yield from _refs(value, f"{where}/{n}")
