"""OpenTelemetry traces: one per request, its phases as child spans, the client's ``traceparent``
continued and the upstream try's sent to the backend (an in-memory exporter reads the spans)."""

from __future__ import annotations

import httpx
import pytest

from sagegate.gateway.app import create_app
from tests.gateway_support import FakeBackend, ServerThread, settings_for, wait_until

sdk = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

BODY = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def test_a_request_is_one_trace_under_the_clients_parent_and_its_try_carries_it_upstream() -> None:
    exporter = sdk.InMemorySpanExporter()
    fake = FakeBackend(tokens=4)
    with (
        ServerThread(fake.app) as be,
        ServerThread(create_app(settings_for([be.url]), span_exporter=exporter)) as gw,
    ):
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
        r = httpx.post(gw.url + "/v1/chat/completions", json=BODY, headers={"traceparent": PARENT})
        assert r.status_code == 200
        refused = httpx.post(gw.url + "/v1/chat/completions", json={**BODY, "model": "nope"})
        assert refused.status_code == 404
        wait_until(
            lambda: len([s for s in exporter.get_finished_spans() if s.name == "sagegate.request"]) == 2
        )
    spans = exporter.get_finished_spans()
    served = [s for s in spans if s.context.trace_id == int(TRACE_ID, 16)]
    names = [s.name for s in sorted(served, key=lambda s: s.start_time)]
    assert names == ["sagegate.request", "intake", "predict", "queue", "upstream", "stream"]
    root = next(s for s in served if s.name == "sagegate.request")
    assert root.parent is not None and root.parent.span_id == 0x00F067AA0BA902B7  # the client's
    assert all(s.parent.span_id == root.context.span_id for s in served if s is not root)
    assert root.attributes["sagegate.status"] == 200 and root.attributes["sagegate.output_tokens"] == 4
    assert root.attributes["sagegate.id"] == r.headers["x-request-id"]
    # the backend was sent the upstream try's span as its parent
    upstream = next(s for s in served if s.name == "upstream")
    sent = fake.state.headers[0]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{upstream.context.span_id:016x}-01"
    other = next(s for s in spans if s.name == "sagegate.request" and s is not root)
    assert other.attributes["sagegate.status"] == 404 and other.context.trace_id != root.context.trace_id


def test_tracing_is_off_by_default_and_sends_no_traceparent() -> None:
    fake = FakeBackend(tokens=4)
    with ServerThread(fake.app) as be, ServerThread(create_app(settings_for([be.url]))) as gw:
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
        assert httpx.post(gw.url + "/v1/chat/completions", json=BODY).status_code == 200
        assert gw.app.state.gateway.tracing.enabled is False
    assert "traceparent" not in fake.state.headers[0]
