"""Whether a process traces, decided from the standard ``OTEL_*`` environment variables.

Tracing is off unless asked for: the spec's default exporter is ``otlp``, but a hub that
exported to localhost:4318 because nothing was set would pay for spans nobody reads.
It is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or an
OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._TRACES_ENDPOINT``);
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turns it off whatever else is set.
"""

from __future__ import annotations

from collections.abc import Mapping

EXPORTERS = frozenset({"otlp", "console"})
"""The exporters a reach process builds itself (``otlp``: OTLP over HTTP/protobuf)."""


def tracing_on(env: Mapping[str, str]) -> bool:
    """True when ``env`` turns tracing on (rules in the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = exporters(env)
    if names is not None:
        return bool(names)
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def exporters(env: Mapping[str, str]) -> list[str] | None:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (known ones, in order; ``none`` is
    none), or None when it is not set (an OTLP endpoint alone means ``otlp``)."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        return None
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if "none" in names:
        return []
    return [n for n in names if n in EXPORTERS]
