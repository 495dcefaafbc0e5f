"""Each request's forecast beside its outcome (issue 64): the default picker's forecast of its first
and last token goes on its access-log line, into ``sagegate_forecast_error_ratio`` and, as the median
over the latest requests, onto ``/metrics``, ``/admin/queue`` and the dashboard's feed."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from tests.gateway_support import admin, fleet, metric, wait_until

BODY = {"model": "fake", "messages": [{"role": "user", "content": "how far to Chur?"}], "max_tokens": 8}


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "sagegate.access"]


def test_a_completed_request_carries_its_forecast_beside_its_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.access")
    slow = {"tokens": 5, "delay_s": 0.01}
    with fleet(slow, dict(slow), access_log="json") as (_, url):
        for i in range(8):
            body = {**BODY, "stream": bool(i % 2)}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                r.read()
        wait_until(lambda: len(lines(caplog)) == 8, what="every line")
        got = lines(caplog)
        snap = admin(url)
        judged = metric(url, 'sagegate_forecast_error_ratio_count{what="ttlt"}')
        median = metric(url, 'sagegate_forecast_median_error{what="ttlt"}')
    first_on = {line["backend"]: line for line in reversed(got)}  # each backend's first line
    for line in first_on.values():  # nothing learned of that backend yet: no forecast in its seconds
        assert "forecast_ttlt_s" not in line and "forecast_ttft_s" not in line  # (a line omits nulls)
    later = [line for line in got if "forecast_ttlt_s" in line]
    assert len(later) == 8 - len(first_on) == judged
    for line in later:  # from the arrival, as the line's other times are: never before the send
        assert line["forecast_ttlt_s"] >= line["forecast_ttft_s"] >= line["queue_s"]  # type: ignore[operator]
    assert median >= 0.0
    factors = snap["forecast"]["factors"]
    assert set(factors) == {line["backend"] for line in got}
    assert all(f["ttlt"] > 0 for f in factors.values())
    assert snap["forecast"]["median_error"]["ttlt"] == pytest.approx(median)


def test_a_picker_that_forecasts_nothing_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.access")
    placement = {"profile": {"picker": "incumbent"}}
    with fleet({"tokens": 3}, access_log="json", placement=placement) as (_, url):
        for _ in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30).status_code == 200
        wait_until(lambda: len(lines(caplog)) == 3, what="every line")
        assert "forecast_ttlt_s" not in lines(caplog)[-1]
        assert admin(url)["forecast"] == {"median_error": {"ttft": None, "ttlt": None}, "factors": {}}
        assert "sagegate_forecast_error_ratio_count" not in httpx.get(url + "/metrics").text
