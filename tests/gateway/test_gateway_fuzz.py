"""A schemathesis run over the gateway's OpenAPI schema, against a live gateway and backend: whatever
it sends, valid or not, the gateway never answers with a 5xx.

schemathesis's pytest plugin does not load under this pytest, so the test draws cases from each
operation's hypothesis strategy itself (positive and negative generation) and sends them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from sagegate.gateway.app import create_app
from tests.gateway_support import FakeBackend, ServerThread, settings_for

pytestmark = pytest.mark.heavy  # a live gateway and backend on loopback

schemathesis = pytest.importorskip("schemathesis")

EXAMPLES = 30


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    # The backend lists no models, so every well-formed body is forwarded: the forwarding path is
    # fuzzed too, not only validation.
    fake = FakeBackend(list_models=False, tokens=3)
    with ServerThread(fake.app) as be:
        s = settings_for(
            [be.url], limits={"max_tokens": 64, "max_body_bytes": 65536}, queue={"max_wait_s": 2.0}
        )
        with ServerThread(create_app(s)) as gw:
            yield gw.url


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzzed_requests_never_get_a_5xx(gateway_url: str, mode: str) -> None:
    ops = _operations(gateway_url)
    assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/completions", "/admin/queue"}
    failures: list[str] = []
    seen: Counter[tuple[str, int]] = Counter()
    for op in ops:

        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=op.as_strategy(schemathesis.GenerationMode(mode)))
        def run(case: Any) -> None:
            resp = case.call(base_url=gateway_url, timeout=10)
            where = f"{case.method.upper()} {case.operation.path}"
            seen[(case.operation.path, resp.status_code)] += 1
            if resp.status_code >= 500:
                failures.append(f"{where} -> {resp.status_code}: {resp.text[:200]}")

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode == "negative"
    assert not failures, failures[:5]
    if mode == "positive":  # valid bodies were forwarded and answered, not only refused
        assert seen[("/v1/chat/completions", 200)] and seen[("/v1/completions", 200)], seen
