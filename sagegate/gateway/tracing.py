"""OpenTelemetry traces, opt-in (``tracing.enabled``): one span a request, a child span a phase.

A request's span (``sagegate.request``) continues the client's W3C ``traceparent`` when it sends
one; its children are its phases as the director walks them: ``intake`` (body, key, token count),
``predict``, ``queue`` (until a backend is chosen), one ``upstream`` per try (its ``traceparent``
goes to the backend, so vLLM's own spans join the trace) and ``stream`` (first byte to last). It ends
when the request ends, however it ends, with the status, outcome and the access log's figures as
attributes. Spans leave through OTLP over HTTP (``tracing.endpoint``) in batches, off the event
loop; without the ``trace`` extra installed, turning it on is refused at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sagegate.gateway.settings_tracing import TracingSettings


class RequestTrace:
    """One request's spans: the request's own and the phase open now."""

    __slots__ = ("_phase", "_span", "_tracer")

    def __init__(self, tracer: Any, span: Any) -> None:
        self._tracer = tracer
        self._span = span
        self._phase: Any = None

    def phase(self, name: str, **attributes: Any) -> None:
        """End the phase open now and start ``name``."""
        from opentelemetry import trace

        if self._phase is not None:
            self._phase.end()
        ctx = trace.set_span_in_context(self._span)
        self._phase = self._tracer.start_span(name, context=ctx, attributes=_clean(attributes))

    def upstream(self, backend: str, attempt: int) -> dict[str, str]:
        """A try on ``backend`` starts: its span, and the headers that carry it to the backend."""
        from opentelemetry import trace
        from opentelemetry.propagate import inject

        self.phase("upstream", backend=backend, attempt=attempt)
        carrier: dict[str, str] = {}
        inject(carrier, context=trace.set_span_in_context(self._phase))
        return carrier

    def end(self, fields: Mapping[str, Any]) -> None:
        """The request ended: its attributes (the access log's line), then its spans close."""
        from opentelemetry.trace import Status, StatusCode

        if self._phase is not None:
            self._phase.end()
            self._phase = None
        self._span.set_attributes(_clean({f"sagegate.{k}": v for k, v in fields.items()}))
        status = fields.get("status")
        if isinstance(status, int) and status >= 500:
            self._span.set_status(Status(StatusCode.ERROR, str(fields.get("outcome", ""))))
        self._span.end()


class Tracing:
    """The gateway's tracer (None inside when off: every call is a no-op)."""

    def __init__(self, settings: TracingSettings, exporter: Any = None) -> None:
        self.settings = settings
        self._tracer: Any = None
        self._provider: Any = None
        if settings.enabled or exporter is not None:
            self._start(exporter)

    def _start(self, exporter: Any) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
        except ImportError as exc:  # pragma: no cover - the extra is in the dev set
            raise RuntimeError(
                "tracing.enabled needs the trace extra: pip install 'sagegate[trace]'"
            ) from exc
        s = self.settings
        provider = TracerProvider(
            resource=Resource.create({"service.name": s.service_name}),
            sampler=ParentBasedTraceIdRatio(s.sample_ratio),
        )
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=s.endpoint)))
        else:  # tests: an in-memory exporter, spans at once
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        self._provider = provider
        self._tracer = provider.get_tracer("sagegate")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(self, headers: Mapping[str, str], request_id: str, route: str) -> RequestTrace | None:
        """A request arrived: its span (under the client's ``traceparent`` if any), in ``intake``."""
        if self._tracer is None:
            return None
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        parent = extract(dict(headers))
        span = self._tracer.start_span(
            "sagegate.request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"sagegate.id": request_id, "sagegate.route": route},
        )
        trace = RequestTrace(self._tracer, span)
        trace.phase("intake")
        return trace

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int and float values (None is dropped)."""
    return {k: v for k, v in attributes.items() if isinstance(v, str | bool | int | float)}
