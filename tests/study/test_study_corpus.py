"""The study's corpus (window sampler, deadline rule), calibration bisection and per-cell metrics."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.record import RequestRecord
from sagegate.core.request import PredictionQuery, TraceRequest, answer_key
from sagegate.loadgen.synthetic import synthetic_workload
from sagegate.predictor.baselines import NoisyOraclePredictor
from sagegate.study.calibrate import calibrate_window, find_knee, violation_rate
from sagegate.study.config import StudyConfig, parse_source
from sagegate.study.metrics import cell_metrics, jain_index
from sagegate.study.windows import make_windows, sample_starts, valid_rows, window_seed, with_deadlines


# --- sampler --------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.integers(1, 50), st.integers(0, 400), st.integers(0, 2**32))
def test_sample_starts_never_overlap(count: int, size: int, extra: int, seed: int) -> None:
    n = count * size + extra
    starts = sample_starts(n, count, size, seed)
    assert len(starts) == count
    assert starts == sorted(starts)
    assert starts[0] >= 0 and starts[-1] + size <= n
    assert all(b - a >= size for a, b in itertools.pairwise(starts))
    assert sample_starts(n, count, size, seed) == starts


def test_sample_starts_depend_on_seed_and_reject_overfull() -> None:
    assert sample_starts(10_000, 40, 200, 1) != sample_starts(10_000, 40, 200, 2)
    with pytest.raises(ValueError):
        sample_starts(7_999, 40, 200, 0)
    assert sample_starts(8_000, 40, 200, 0) == [200 * i for i in range(40)]


def test_window_seeds_differ_by_source_and_index() -> None:
    seeds = {window_seed(1, s, i) for s in ("a", "b") for i in range(5)}
    assert len(seeds) == 10
    assert window_seed(1, "a", 0) == window_seed(1, "a", 0)


# --- deadlines and windows -------------------------------------------------------------------------
def test_deadline_rule_matches_the_noisy_oracle_prediction() -> None:
    cfg = StudyConfig()
    reqs = synthetic_workload(50, rate=5.0, seed=3)
    seed = 12345
    out = with_deadlines(reqs, seed, cfg)
    oracle = NoisyOraclePredictor(0.2, seed, truth=answer_key(reqs))
    for r, o in zip(reqs, out, strict=True):
        expect = r.arrival_s + 20.0 * (
            0.0004 * r.prompt_tokens + 0.02 * oracle.noisy_value(PredictionQuery.of(r))
        )
        assert o.deadline_s == pytest.approx(expect, rel=1e-12)
        assert o.priority == 1
    noisy = [oracle.noisy_value(PredictionQuery.of(r)) / r.output_tokens for r in reqs]
    assert len(set(noisy)) == len(noisy)  # the noise is per request, not one factor


def test_make_windows_are_contiguous_rebased_and_deterministic() -> None:
    cfg = replace(StudyConfig(), windows=4, window_size=25)
    rows = synthetic_workload(300, rate=2.0, seed=7)
    wins = make_windows(rows, "syn", cfg, max_tokens=None)
    assert len(wins) == 4
    assert [w.start_row for w in wins] == sorted(w.start_row for w in wins)
    for w in wins:
        reqs = w.requests
        assert len(reqs) == 25
        assert reqs[0].arrival_s == 0.0
        assert [r.rid for r in reqs] == list(range(25))
        src = rows[w.start_row : w.start_row + 25]
        gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(src)]
        mine = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(reqs)]
        assert mine == pytest.approx(gaps)
        assert [r.prompt_tokens for r in reqs] == [r.prompt_tokens for r in src]
        assert all(r.deadline_s is not None and r.deadline_s > r.arrival_s for r in reqs)
    again = make_windows(rows, "syn", cfg, max_tokens=None)
    assert [w.requests for w in again] == [w.requests for w in wins]
    other = make_windows(rows, "syn", replace(cfg, seed=cfg.seed + 1), max_tokens=None)
    assert [w.start_row for w in other] != [w.start_row for w in wins]


def test_valid_rows_drop_what_the_engine_cannot_serve() -> None:
    rows = [
        TraceRequest(0.0, 10, 5),
        TraceRequest(1.0, 0, 5),
        TraceRequest(2.0, 900, 200),
        TraceRequest(3.0, 10, 0),
    ]
    assert valid_rows(rows, max_tokens=1000) == [rows[0]]
    assert valid_rows(rows, max_tokens=None) == [rows[0], rows[2]]


def test_parse_source() -> None:
    s = parse_source("bgpt=/data/BurstGPT.csv,format=burstgpt,tenant_column=Model,rate_scale=2.5")
    assert (s.name, s.path, s.fmt) == ("bgpt", "/data/BurstGPT.csv", "burstgpt")
    assert s.opts() == {"tenant_column": "Model", "rate_scale": 2.5}
    with pytest.raises(ValueError):
        parse_source("no-path")


# --- calibration ----------------------------------------------------------------------------------
def test_find_knee_on_a_step() -> None:
    calls: list[float] = []

    def step(f: float) -> float:
        calls.append(f)
        return 0.01 if f >= 10**0.7 else 0.0

    knee = find_knee(step, 0.005, -2.0, 4.0, 30)
    assert knee.log10_factor == pytest.approx(0.7, abs=6 / 2**30 * 2)
    assert knee.censored == "" and knee.evaluations == 30 == len(calls)


def test_find_knee_censoring() -> None:
    assert find_knee(lambda f: 1.0, 0.005, -2, 4, 30).censored == "low"
    high = find_knee(lambda f: 0.0, 0.005, -2, 4, 30)
    assert high.censored == "high" and high.log10_factor == 4.0


def test_calibrated_knee_brackets_the_target() -> None:
    cfg = replace(StudyConfig(), windows=1, window_size=60)
    rows = synthetic_workload(60, rate=2.0, prompt_mean=800, output_mean=150, seed=4)
    (w,) = make_windows(rows, "syn", cfg, max_tokens=None)
    cal = calibrate_window(w, cfg)
    assert cal.censored == ""
    assert violation_rate(w.requests, cal.lambda_ref, cfg, w.seed) >= cfg.target_violation
    below = 10 ** (cal.log10_ref - (cfg.bisect_hi - cfg.bisect_lo) / 2**cfg.bisect_steps)
    assert violation_rate(w.requests, below, cfg, w.seed) < cfg.target_violation
    assert cal.saturated_rate > 0
    assert cal.utilisation(2.0) == pytest.approx(2 * cal.utilisation(1.0))


# --- metrics --------------------------------------------------------------------------------------
def test_jain_index_hand_cases() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert math.isnan(jain_index([0.7]))


def _rec(
    rid: int, finish: float | None, deadline: float, tenant: str = "a", first: float | None = None
) -> RequestRecord:
    return RequestRecord(
        rid=rid,
        arrival_s=0.0,
        prompt_tokens=10,
        output_tokens=4 if finish is not None else 0,
        first_token_s=first if first is not None else (None if finish is None else finish / 2),
        finish_s=finish,
        deadline_s=deadline,
        tenant=tenant,
    )


def test_cell_metrics_weights_goodput_by_priority() -> None:
    work = [TraceRequest(0.0, 10, 4, rid=0, priority=3), TraceRequest(0.0, 10, 4, rid=1, priority=1)]
    recs = [_rec(0, 1.0, 2.0, "a"), _rec(1, 3.0, 2.0, "b")]  # the heavy one on time, the light one late
    m = cell_metrics(work, recs, preemptions=2)
    assert m["anwg"] == pytest.approx(0.75)
    assert m["violation"] == pytest.approx(0.5)
    assert m["completion"] == 1.0
    assert m["ttlt_mean"] == pytest.approx(2.0)
    assert m["throughput_req"] == pytest.approx(2 / 3.0)
    assert m["throughput_tok"] == pytest.approx(8 / 3.0)
    assert m["preemptions"] == 2.0
    assert m["jain"] == pytest.approx(jain_index([1.0, 0.0]))


def test_cell_metrics_undefined_when_nothing_finishes() -> None:
    work = [TraceRequest(0.0, 10, 4, rid=0)]
    m = cell_metrics(work, [_rec(0, None, 1.0)], preemptions=0)
    assert m["anwg"] == 0.0 and m["violation"] == 1.0 and m["completion"] == 0.0
    assert all(math.isnan(m[k]) for k in ("ttlt_mean", "ttlt_p99", "ttft_mean", "tpot_mean", "jain"))
