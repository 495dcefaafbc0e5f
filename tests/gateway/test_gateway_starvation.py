"""The starvation bound under sustained overload, over real loopback HTTP: with ``sagesched`` a large
prompt behind an endless supply of small ones is served (it ages into the front lane at half the
queue's limit) instead of waiting until the limit rejects it; and every rejection is logged."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app, gateway_policy
from sagegate.gateway.metrics import RateLimitedLog
from tests.gateway_support import FakeBackend, ServerThread, admin, chat_body, settings_for, wait_until


@pytest.mark.parametrize(
    ("spec", "share", "expected"),
    [
        ("sagesched", 0.5, 30.0),
        ("sagesched:max_wait_s=12", 0.5, 12.0),
        ("sagesched:max_wait_s=none", 0.5, None),
        ("sagesched", 0.0, None),
    ],
)
def test_sagesched_gets_a_bound_from_the_queue_limit(spec: str, share: float, expected: float | None) -> None:
    s = settings_for([], policy=spec, queue={"max_wait_s": 60.0, "aged_share": share})
    policy: Any = gateway_policy(s)
    assert policy.name == "sagesched" and policy.max_wait_s == expected
    assert gateway_policy(settings_for([], policy="fcfs")).name == "fcfs"  # no such parameter: as is


def _overload(share: float) -> int:
    """A 3,000-token prompt sent while eight clients keep a one-at-a-time backend busy with small
    ones for 3.5 s (shortest prompt first: the large one is always last). Its status."""
    fake = FakeBackend(tokens=8, delay_s=0.0125)  # 0.1 s a request
    with ServerThread(fake.app) as be:
        s = settings_for(
            [],
            backends=[{"url": be.url, "capacity_tokens": 700}],  # one small request at a time
            policy="sagesched",
            tokenizer="chars",
            queue={"max_wait_s": 2.0, "aged_share": share},
        )
        with ServerThread(create_app(s)) as gw:
            stop = time.monotonic() + 3.5

            def small() -> None:
                with httpx.Client(base_url=gw.url, timeout=10) as c:
                    while time.monotonic() < stop:
                        c.post("/v1/chat/completions", json=chat_body("x" * 400))

            threads = [threading.Thread(target=small, daemon=True) for _ in range(8)]
            for t in threads:
                t.start()
            # the overload is on: the backend busy and small ones queued (the large one comes last)
            wait_until(lambda: admin(gw.url)["queued"] >= 4, what="a queue of small requests")
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body("y" * 12_000), timeout=10)
            for t in threads:
                t.join(10)
            return r.status_code


@pytest.mark.heavy
def test_a_large_prompt_is_served_under_overload_and_refusals_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sagegate.gateway")
    status = _overload(share=0.0)  # no bound: starved until the queue's limit
    assert status == 429
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert any("queue_timeout" in m for m in lines), lines
    status = _overload(share=0.5)  # the default bound: aged at 1 s, served
    assert status == 200


def test_rejection_log_is_rate_limited() -> None:
    now = [0.0]
    lines: list[str] = []

    class Sink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("sagegate.test-ratelimit")
    logger.addHandler(Sink())
    logger.propagate = False
    rl = RateLimitedLog(logger, "rejected %d request(s): %s", every_s=1.0, clock=lambda: now[0])
    for _ in range(1000):
        rl.note("queue_full_requests")
        now[0] += 0.001
    now[0] += 1.0
    rl.note("queue_full_requests")
    rl.note("queue_timeout")
    assert lines == [
        "rejected 1 request(s): queue_full_requests",
        "rejected 1000 request(s): queue_full_requests",
        "rejected 1 request(s): queue_timeout",
    ]
