"""The demo's headline figures: throughput over the loaded window beside the makespan, goodput at an SLO,
the engines' own hit rate and preemptions, ratios draw by draw with their range, and what the
requests a predictor under-estimated cost."""

from __future__ import annotations

import math

import pytest

from sagegate.core.record import RequestRecord
from sagegate.core.summary import Slo, loaded_throughput, summarize
from sagegate.loadgen.headline import FIGURES, Spread, headline, ratios, run_figures, under_predicted


def _rec(rid: int, arrival: float, ttft: float, ttlt: float, out: int = 10, **kw: object) -> RequestRecord:
    return RequestRecord(
        rid=rid,
        arrival_s=arrival,
        prompt_tokens=100,
        output_tokens=out,
        first_token_s=arrival + ttft,
        finish_s=arrival + ttlt,
        **kw,  # type: ignore[arg-type]
    )


def test_loaded_throughput_leaves_out_the_ramp_and_a_lone_straggler() -> None:
    """Twenty requests finishing one a second, then one that finishes 100 s later: the makespan
    figure drops by a factor of ~5, the loaded window's does not move."""
    steady = [_rec(i, 0.0, 0.1, 1.0 + i, out=100) for i in range(20)]
    straggler = _rec(20, 0.0, 0.1, 120.0, out=100)
    assert loaded_throughput(steady) == pytest.approx(100.0)
    assert loaded_throughput([*steady, straggler]) == pytest.approx(100.0)
    with_tail, without = summarize([*steady, straggler]), summarize(steady)
    assert with_tail["throughput_tok_s"] < without["throughput_tok_s"] / 4
    assert with_tail["loaded_tok_s"] == pytest.approx(without["loaded_tok_s"])
    assert math.isnan(loaded_throughput(steady[:5]))  # too few completions for a window


def test_run_figures_count_goodput_at_the_slo_and_read_the_engines_counters() -> None:
    recs = [
        _rec(0, 0.0, 0.5, 2.0, out=100),
        _rec(1, 1.0, 3.0, 4.0),
        _rec(2, 2.0, 0.2, 20.0),
    ]  # ok, late, slow
    figs = run_figures(recs, {"prefix_hits": 30.0, "prefix_queries": 120.0, "preemptions": 4.0},
                       Slo(ttft_s=2.0, tpot_s=0.1))  # fmt: skip
    assert figs["slo_attainment"] == pytest.approx(1 / 3)
    assert figs["goodput_req_s"] == pytest.approx(1 / 22.0)  # one request over the 22 s span
    assert figs["prefix_hit_rate"] == 0.25 and figs["preemptions"] == 4.0
    assert figs["ttlt_max_s"] == 20.0
    assert {f.key for f in FIGURES} <= set(figs)


def test_ratios_pair_draws_and_keep_their_range() -> None:
    runs = {
        "gateway": [{"ttlt_mean_s": 5.0, "goodput_req_s": 3.0}, {"ttlt_mean_s": 9.0, "goodput_req_s": 2.0}],
        "rr": [{"ttlt_mean_s": 10.0, "goodput_req_s": 2.0}, {"ttlt_mean_s": 10.0, "goodput_req_s": 2.0}],
    }
    r = ratios(runs, "gateway", "rr")
    assert r["ttlt_mean_s"] == Spread(0.7, 0.5, 0.9)
    assert r["goodput_req_s"] == Spread(1.25, 1.0, 1.5)
    assert math.isnan(r["preemptions"].mean)  # a figure neither run has
    head = headline(runs, "gateway", ["rr", "absent"])
    assert set(head["ratios"]) == {"rr"}  # type: ignore[arg-type]
    assert Spread(0.7, 0.5, 0.9).show("{:.2f}") == "0.70 (0.50–0.90)"


def test_under_predicted_compares_the_long_requests_it_missed_with_the_baseline() -> None:
    gw = [_rec(i, float(i), 0.1, 5.0, out=50, predicted_mean=50.0) for i in range(18)]
    gw.append(_rec(18, 18.0, 30.0, 60.0, out=900, predicted_mean=100.0))  # long, predicted short
    gw.append(_rec(19, 19.0, 0.2, 30.0, out=900, predicted_mean=800.0))  # long, predicted long
    base = [_rec(r.rid, r.arrival_s, 1.0, 25.0 if r.output_tokens > 100 else 6.0) for r in gw]
    cost = under_predicted(gw, base)
    assert cost is not None and cost["n"] == 1
    assert cost["ttlt_gateway_s"] == 60.0 and cost["ttlt_baseline_s"] == 25.0
    assert cost["worst_ttft_gateway_s"] == 30.0 and cost["worst_ttft_baseline_s"] == 1.0
    assert under_predicted(gw[:18], base) is None  # nothing long was under-predicted
