"""Human durations in settings: ``"250ms"``, ``"5s"``, ``"2m"``, ``"1h30m"``.

Seed 000's ``config.yaml`` writes ``probe.interval: 5s``; a setting that takes a number
in its own unit (seconds, milliseconds, hours, days) takes such a string too, converted
to that unit. A bare number keeps meaning the setting's unit, so existing files and
``REACH_*`` variables read as before.
"""

from __future__ import annotations

import math
import re

UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d)")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


class DurationError(ValueError):
    """A value that is no duration; the message says what is accepted."""


def seconds_of(text: str) -> float:
    """Seconds in ``text``: one or more number+unit parts (``1m30s``), units ms s m h d.

    Whitespace around it is ignored; inside it, none is allowed. No sign: a duration is
    never negative."""
    s = text.strip()
    if not s:
        raise DurationError("a duration is a number with a unit (250ms, 5s, 2m, 1h, 1d)")
    pos, total = 0, 0.0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * UNITS_S[match.group(2)]
        pos = match.end()
    if pos != len(s):
        raise DurationError(
            f"{text!r} is no duration: write a number with a unit, e.g. 250ms, 5s, 2m, 1h30m, 1d"
        )
    return total


def in_unit(value: object, unit_s: float) -> object:
    """``value`` expressed in a setting whose unit is ``unit_s`` seconds.

    A string with a unit is converted (``"2m"`` is 120.0 for a seconds setting, 2000.0 for
    ``0.001``); a bare number, in a string or not, is left for the field to validate in
    its own unit; anything else is returned unchanged for the field to refuse."""
    if not isinstance(value, str):
        return value
    if _NUMBER.fullmatch(value.strip()):
        return value
    converted = seconds_of(value) / unit_s
    if not math.isfinite(converted):
        raise DurationError(f"{value!r} is too long a duration")
    return converted
