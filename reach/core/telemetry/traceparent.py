"""The W3C Trace Context ``traceparent`` header, parsed and formatted by hand.

The SDK and the hub pass a reach's trace on even where OpenTelemetry is not installed or
is off (an agent with no tracing still hands its delivery's trace to the reaches its
handler makes), so reading and writing the header needs no OpenTelemetry import.
https://www.w3.org/TR/trace-context/#traceparent-header
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = "traceparent"
_FORM = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
MAX_LENGTH = 512  # a future version may append fields; more than this is not a header


@dataclass(frozen=True, slots=True)
class TraceParent:
    """One span's place in a trace: the trace, the span (the parent of the next hop) and
    whether the trace is sampled."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    sampled: bool = True

    def header(self) -> str:
        """The header's value (version 00)."""
        return format_header(self.trace_id, self.span_id, self.sampled)


def parse(value: str | None) -> TraceParent | None:
    """The header's trace and span, or None when it is absent or invalid (the receiver
    then starts a trace of its own, as the spec says)."""
    if not value or len(value) > MAX_LENGTH:
        return None
    found = _FORM.match(value.strip())
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        return None  # ff is forbidden; version 00 has exactly four fields
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, bool(int(flags, 16) & 0x01))


def format_header(trace_id: str, span_id: str, sampled: bool = True) -> str:
    """``00-{trace}-{span}-{flags}``; ids are given as hex (padded to their width)."""
    return f"00-{trace_id.zfill(32)}-{span_id.zfill(16)}-{'01' if sampled else '00'}"


def trace_id_of(value: str | None) -> str | None:
    """The trace id a header names (None: no valid header)."""
    parsed = parse(value)
    return None if parsed is None else parsed.trace_id
