"""The forecast beside the outcome (``policies.forecast_report``): each backend's factor is learned from
its own past requests, and a request is judged by the factor as it stood before its own outcome."""

from __future__ import annotations

import pytest

from sagegate.policies.forecast_report import WINDOW, ForecastReport
from sagegate.policies.placement.outcome import Forecasted


def test_a_backend_s_first_request_is_not_judged_and_teaches_its_factor() -> None:
    report = ForecastReport()
    judged = report.judge("a", Forecasted(0.1, 1.0), 0.3, 3.0)
    assert judged.ttft_s is None and judged.ttlt_s is None and judged.ttlt_error is None
    assert report.factors()["a"] == {"ttft": pytest.approx(3.0), "ttlt": pytest.approx(3.0)}
    assert report.median_errors() == {"ttft": None, "ttlt": None}


def test_a_backend_that_runs_at_a_steady_multiple_of_the_forecast_is_forecast_exactly() -> None:
    report = ForecastReport()
    for i in range(1, 30):
        f = Forecasted(0.01 * i, 0.2 * i)
        judged = report.judge("a", f, 4.0 * f.ttft_s, 2.5 * f.ttlt_s)
        if i > 1:
            assert judged.ttlt_s == pytest.approx(2.5 * f.ttlt_s) and judged.ttlt_error == pytest.approx(0.0)
            assert judged.ttft_s == pytest.approx(4.0 * f.ttft_s)
    assert report.median_errors() == {"ttft": pytest.approx(0.0), "ttlt": pytest.approx(0.0)}


def test_a_request_is_judged_before_its_own_outcome_is_learned() -> None:
    report = ForecastReport()
    for _ in range(5):
        report.judge("a", Forecasted(0.1, 1.0), 0.1, 2.0)
    slow = report.judge("a", Forecasted(0.1, 1.0), 0.1, 4.0)  # twice as slow as everything before
    assert slow.ttlt_s == pytest.approx(2.0) and slow.ttlt_error == pytest.approx(0.5)
    assert 2.0 < report.factors()["a"]["ttlt"] < 4.0  # learned only now, and only in part


def test_each_backend_has_its_own_factor() -> None:
    report = ForecastReport()
    report.judge("fast", Forecasted(0.1, 1.0), 0.1, 1.0)
    judged = report.judge("slow", Forecasted(0.1, 1.0), 0.5, 5.0)
    assert judged.ttlt_s is None  # nothing of fast's speed is lent to slow
    assert report.judge("slow", Forecasted(0.1, 1.0), 0.5, 5.0).ttlt_error == pytest.approx(0.0)


def test_without_a_first_token_only_the_last_is_judged() -> None:
    report = ForecastReport()
    report.judge("a", Forecasted(0.1, 1.0), 0.2, 2.0)
    judged = report.judge("a", Forecasted(0.1, 1.0), None, 2.0)
    assert judged.ttft_error is None and judged.ttlt_error == pytest.approx(0.0)
    assert len(report.ttft_errors) == 0 and len(report.ttlt_errors) == 1


def test_the_median_is_over_the_latest_window() -> None:
    report = ForecastReport()
    report.judge("a", Forecasted(0.1, 1.0), 0.1, 1.0)
    for _ in range(10):  # the backend turns twice as fast: far off while the factor catches up...
        report.judge("a", Forecasted(0.1, 2.0), 0.1, 1.0)
    assert report.median_errors()["ttlt"] > 0.05
    for _ in range(WINDOW):  # ...then exact: the old errors age out of the window
        report.judge("a", Forecasted(0.1, 2.0), 0.1, 1.0)
    assert report.median_errors()["ttlt"] == pytest.approx(0.0, abs=1e-9)
    assert report.factors()["a"]["ttlt"] == pytest.approx(0.5)
