"""The W3C traceparent header and the OTEL_* switch (reach.core.telemetry)."""

from __future__ import annotations

import pytest

from reach.core.telemetry import switch
from reach.core.telemetry.traceparent import TraceParent, format_header, parse, trace_id_of

T, S = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (f"00-{T}-{S}-01", TraceParent(T, S, True)),
        (f"00-{T}-{S}-00", TraceParent(T, S, False)),
        (f"  00-{T}-{S}-01  ", TraceParent(T, S, True)),
        (f"01-{T}-{S}-03-future-field", TraceParent(T, S, True)),  # a later version: its fields
        (f"00-{T}-{S}-01-extra", None),  # version 00 has four fields
        (f"ff-{T}-{S}-01", None),
        (f"00-{'0' * 32}-{S}-01", None),
        (f"00-{T}-{'0' * 16}-01", None),
        (f"00-{T.upper()}-{S}-01", None),
        (f"00-{T[:-1]}-{S}-01", None),
        ("", None),
        (None, None),
        ("00-" + "a" * 600, None),
    ],
)
def test_parse(header: str | None, parsed: TraceParent | None) -> None:
    assert parse(header) == parsed


def test_format_round_trips_and_pads() -> None:
    assert parse(format_header(T, S)) == TraceParent(T, S, True)
    assert TraceParent(T, S, False).header() == f"00-{T}-{S}-00"
    assert format_header("1", "2") == f"00-{'0' * 31}1-{'0' * 15}2-01"
    assert trace_id_of(f"00-{T}-{S}-01") == T
    assert trace_id_of("junk") is None


ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),  # off by default, though the spec's default exporter is otlp
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp,none"}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),  # not one a reach process builds
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_switch(env: dict[str, str], on: bool) -> None:
    assert switch.tracing_on(env) is on


def test_exporters_named() -> None:
    assert switch.exporters({}) is None
    assert switch.exporters({"OTEL_TRACES_EXPORTER": " OTLP , console"}) == ["otlp", "console"]
