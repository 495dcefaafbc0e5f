"""``tracing``: OpenTelemetry spans, opt-in (``gateway.tracing``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TracingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Send a trace per request (needs the ``trace`` extra: ``pip install 'sagegate[trace]'``)."""
    endpoint: str = "http://localhost:4318/v1/traces"
    """An OTLP/HTTP collector (the compose stack's ``otel-collector`` with ``--profile tracing``)."""
    service_name: str = "sagegate"
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of requests traced when the client sends no sampling decision (its ``traceparent``'s
    sampled flag is followed when it does)."""
