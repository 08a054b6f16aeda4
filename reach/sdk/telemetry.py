"""OpenTelemetry in a reach process: off unless the ``OTEL_*`` variables turn it on.

Off (the default) costs a cached boolean: nothing of the OpenTelemetry SDK is imported and
no span is made; a reach's ``traceparent`` is still handed on by hand
(``reach.core.telemetry.traceparent``), so a trace crosses a process that does not trace.
On (``reach.core.telemetry.switch``), `configure` installs the process's tracer provider
(OTLP over HTTP, or the console) unless one is installed already, and `span` makes the
spans a reach crosses: the hub's task and attempt spans, an agent's handler span.

The hub's processes call `configure` as they start (``reach.hub.tracing``); so does
``Agent.serve``. A caller's own code sets up OpenTelemetry as it likes: ``reach.send``
injects the current span's context wherever it comes from (`outgoing`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from reach.core.telemetry import switch
from reach.core.telemetry.traceparent import HEADER, format_header, trace_id_of
from reach.errors import BusinessError

TRACER_NAME = "reach"
_lock = threading.Lock()
_on: bool | None = None
_configured = False


def enabled() -> bool:
    """Whether this process traces: the environment asks for it and the OpenTelemetry SDK
    is installed (``agent-reach[otel]``). Read once."""
    global _on
    if _on is None:
        _on = switch.tracing_on(os.environ) and _sdk_installed()
    return _on


def _sdk_installed() -> bool:
    import importlib.util

    try:
        found = importlib.util.find_spec("opentelemetry.sdk") is not None
    except ImportError:  # not even the API: its parent package is missing
        found = False
    if not found:
        logging.getLogger("reach.sdk.telemetry").warning(
            "OTEL_* asks for tracing but the OpenTelemetry SDK is not installed "
            "(pip install 'agent-reach[otel]'): no spans; trace context is passed on"
        )
    return found


def reset() -> None:
    """Read the environment again at the next `enabled` (tests that change it)."""
    global _on
    _on = None


def configure(service_name: str) -> bool:
    """Install this process's tracer provider from the ``OTEL_*`` variables, once (a
    provider already installed, by ``opentelemetry-instrument`` or the application, is
    kept); False when tracing is off. ``service_name`` applies unless
    ``OTEL_SERVICE_NAME`` names one."""
    global _configured
    if not enabled():
        return False
    with _lock:
        if _configured:
            return True
        from opentelemetry import trace as otel
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if not isinstance(otel.get_tracer_provider(), TracerProvider):
            named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
            provider = TracerProvider(resource=Resource.create(named))
            for name in switch.exporters(os.environ) or ["otlp"]:
                if name == "console":
                    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
                else:
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                        OTLPSpanExporter,
                    )

                    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            otel.set_tracer_provider(provider)
        _configured = True
        return True


def flush(timeout_ms: int = 5_000) -> None:
    """Export what this process's provider still holds (before a process ends on its own
    terms, e.g. a prefork child that ``os._exit``\\ s)."""
    if not _configured:
        return
    from opentelemetry import trace as otel

    provider: Any = otel.get_tracer_provider()
    force = getattr(provider, "force_flush", None)
    if force is not None:
        force(timeout_ms)


def header_of(span: Any) -> str | None:
    """The ``traceparent`` that makes the next hop a child of ``span`` (None: not a real
    span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return format_header(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", ctx.trace_flags.sampled)


def current_traceparent() -> str | None:
    """The current OpenTelemetry span's ``traceparent`` in this thread or coroutine; None
    when there is none or nothing in the process uses OpenTelemetry (never imports it)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace as otel

    return header_of(otel.get_current_span())


def outgoing(fallback: str | None) -> str | None:
    """The ``traceparent`` a request to the hub carries: the current span's, else
    ``fallback`` (inside a handler, the one its delivery brought)."""
    return current_traceparent() or fallback


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None: tracing off, or no span."""
    if not enabled():
        return None
    return trace_id_of(current_traceparent())


def start(
    name: str,
    parent: str | None,
    attributes: Mapping[str, Any],
    kind: str = "internal",
) -> Any:
    """A span started as a child of the ``parent`` traceparent (a root when None), not made
    current: for spans that end elsewhere (an attempt begins on a worker slot and ends on
    the exchanger's thread). None when tracing is off."""
    if not enabled():
        return None
    from opentelemetry import trace as otel

    tracer, propagator = _tracing()
    ctx = propagator.extract({HEADER: parent}) if parent else None
    return tracer.start_span(
        name,
        context=ctx,
        kind=getattr(otel.SpanKind, kind.upper()),
        attributes={k: v for k, v in attributes.items() if v is not None},
    )


_made: tuple[Any, Any] | None = None


def _tracing() -> tuple[Any, Any]:
    """This process's tracer and W3C propagator, made once: ``get_tracer`` builds a new
    tracer (and its instrumentation scope) on every call, a cost per span on the hot path.
    Before a provider is installed the tracer is OpenTelemetry's proxy, which follows the
    provider installed later."""
    global _made
    if _made is None:
        from opentelemetry import trace as otel
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _made = (otel.get_tracer(TRACER_NAME), TraceContextTextMapPropagator())
    return _made


def finish(span: Any, outcome: str, error: str | None = None, **attributes: Any) -> None:
    """End ``span`` (from `start`; None is fine) with its outcome; once (a second call,
    e.g. a recording retried after a database outage, does nothing)."""
    if span is None or not span.is_recording():
        return
    ended = {k: v for k, v in attributes.items() if v is not None}
    span.set_attributes({"reach.outcome": outcome, **ended})  # one lock, not one per key
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


@contextmanager
def within(made: Any) -> Iterator[None]:
    """``made`` (from `start`; None: nothing) as the current span for the block, so what
    runs there (log lines, nested spans) belongs to it."""
    if made is None:
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel

    token = otel_context.attach(otel.set_span_in_context(made))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def span(
    name: str,
    parent: str | None,
    attributes: Mapping[str, Any],
    kind: str = "internal",
) -> Iterator[str | None]:
    """A span, current for the block, child of the ``parent`` traceparent; yields the
    traceparent the block's own reaches carry. Off, it yields ``parent`` untouched (the
    trace passes through) and costs nothing. An exception ends it as an error."""
    if not enabled():
        yield parent
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel

    made = start(name, parent, attributes, kind)
    token = otel_context.attach(otel.set_span_in_context(made))
    try:
        yield header_of(made)
    except BaseException as exc:
        outcome = "business_error" if isinstance(exc, BusinessError) else "failure"
        finish(made, outcome, f"{type(exc).__name__}: {exc}")
        raise
    else:
        finish(made, "success")
    finally:
        otel_context.detach(token)
