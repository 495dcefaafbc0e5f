"""The study's statistics against scipy and hand-computed cases."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.study import stats
from sagegate.study.stats import MICROSCOPIC, STABLE, SUPPORTED, PairedDiff

small_ints = st.lists(st.integers(0, 4), min_size=2, max_size=25)


# --- tau-b and rho ------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_tau_b_and_rho_match_scipy_with_ties(data: st.DataObject) -> None:
    x = data.draw(small_ints)
    y = data.draw(st.lists(st.integers(0, 4), min_size=len(x), max_size=len(x)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input; both then answer NaN
        ref_tau = scipy.stats.kendalltau(x, y).statistic
        ref_rho = scipy.stats.spearmanr(x, y).statistic
    tau, rho = stats.kendall_tau_b(x, y), stats.spearman_rho(x, y)
    if math.isnan(ref_tau):
        assert math.isnan(tau)
    else:
        assert tau == pytest.approx(ref_tau, abs=1e-12)
    if math.isnan(ref_rho):
        assert math.isnan(rho)
    else:
        assert rho == pytest.approx(ref_rho, abs=1e-12)


def test_tau_b_hand_cases() -> None:
    assert stats.kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one tie on each side: 4 concordant, 0 discordant, 5 untied pairs each side -> 4/5
    assert stats.kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8)
    # undefined: every value of one side tied, or fewer than two pairs
    assert math.isnan(stats.kendall_tau_b([1, 1, 1], [1, 2, 3]))
    assert math.isnan(stats.kendall_tau_b([1.0], [2.0]))


def test_tau_b_excludes_undefined_pairs() -> None:
    x = [1.0, 2.0, math.nan, 4.0, 5.0]
    y = [2.0, 1.0, 3.0, math.nan, 6.0]
    assert stats.kendall_tau_b(x, y) == pytest.approx(scipy.stats.kendalltau([1, 2, 5], [2, 1, 6]).statistic)


def test_spearman_hand_case_with_ties() -> None:
    # ranks x = (1.5, 1.5, 3), y = (1, 2, 3): cov 1.5, var 1.5 and 2 -> 1.5 / sqrt(3)
    assert stats.spearman_rho([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3))
    assert stats.spearman_rho([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(stats.spearman_rho([5, 5, 5], [1, 2, 3]))


def test_average_ranks_share_ties() -> None:
    assert list(stats.average_ranks([10, 30, 20, 30])) == [1.0, 3.5, 2.0, 3.5]


# --- rankings and agreement ------------------------------------------------------------------------
def test_compare_counts_exclusions_and_orients() -> None:
    a = {"p": 1.0, "q": 2.0, "r": math.nan, "s": 3.0}
    b = {"p": 1.0, "q": 2.0, "r": 5.0}
    ag = stats.compare(a, b, higher_is_better=True)
    assert ag.n == 2 and ag.excluded == 2  # r undefined in a, s absent from b
    assert ag.tau_b == pytest.approx(1.0)
    assert ag.top1 == 1.0


def test_top_agreement_with_ties_and_direction() -> None:
    a = {"p": 1.0, "q": 1.0, "r": 3.0, "s": 4.0}
    b = {"p": 2.0, "q": 1.0, "r": 3.0, "s": 4.0}
    # lower is better: a's best are {p, q} (tied), b's best is q -> top-1 agrees
    ag = stats.compare(a, b, higher_is_better=False)
    assert ag.top1 == 1.0
    assert ag.top3 == pytest.approx(1.0)
    ag_hi = stats.compare(a, {"p": 4.0, "q": 3.0, "r": 2.0, "s": 1.0}, higher_is_better=True)
    assert ag_hi.top1 == 0.0
    assert ag_hi.tau_b < 0
    assert stats.ranking({"x": 2.0, "y": 1.0, "z": math.nan}, higher_is_better=False) == ["y", "x"]


# --- bootstrap ------------------------------------------------------------------------------------
def test_bootstrap_is_reproducible_for_a_seed() -> None:
    vals = np.random.default_rng(1).normal(10, 3, size=40)
    first = stats.bootstrap_ci(vals, resamples=2000, seed=42)
    assert stats.bootstrap_ci(vals, resamples=2000, seed=42) == first
    assert stats.bootstrap_ci(vals, resamples=2000, seed=43) != first
    mean, lo, hi = first
    assert lo < mean < hi
    assert mean == pytest.approx(vals.mean())


def test_bootstrap_interval_of_a_constant_is_the_constant() -> None:
    assert stats.bootstrap_ci([2.5] * 10, resamples=200, seed=0) == (2.5, 2.5, 2.5)


def test_bootstrap_pvalue_bounds() -> None:
    b = 1999
    assert stats.bootstrap_pvalue(np.ones(b)) == pytest.approx(2 / (b + 1))
    assert stats.bootstrap_pvalue(np.concatenate([np.ones(100), -np.ones(100)])) == 1.0


def test_paired_diff_uses_shared_windows() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(5, 2, size=30)  # big window-to-window spread, tiny constant difference
    idx = stats.bootstrap_indices(30, 2000, seed=9)
    d = stats.paired_diff(base + 0.1, base, idx)
    assert d.diff == pytest.approx(0.1)
    assert d.lo == pytest.approx(0.1) and d.hi == pytest.approx(0.1)
    assert d.excludes_zero


# --- reversals ------------------------------------------------------------------------------------
def pd(a: float, b: float, lo: float, hi: float) -> PairedDiff:
    return PairedDiff(a, b, lo, hi, 0.001)


def test_reversal_classes_higher_is_better() -> None:
    # stable: A ahead in both conditions
    assert stats.classify_reversal(pd(0.9, 0.7, 0.1, 0.3), pd(0.8, 0.6, 0.1, 0.3), True) == STABLE
    # supported: A ahead by > 10% in one, B ahead by > 10% in the other, both intervals exclude 0
    assert stats.classify_reversal(pd(0.9, 0.7, 0.1, 0.3), pd(0.5, 0.7, -0.3, -0.1), True) == SUPPORTED
    # microscopic: flips, but the lead in condition 2 is 2% of the loser's value
    assert stats.classify_reversal(pd(0.9, 0.7, 0.1, 0.3), pd(0.686, 0.7, -0.02, -0.01), True) == MICROSCOPIC
    # microscopic: flips with a large lead, but an interval covers 0
    assert stats.classify_reversal(pd(0.9, 0.7, 0.1, 0.3), pd(0.5, 0.7, -0.4, 0.05), True) == MICROSCOPIC
    # a tie on one side is not a flip
    assert stats.classify_reversal(pd(0.7, 0.7, -0.1, 0.1), pd(0.5, 0.7, -0.3, -0.1), True) == STABLE


def test_reversal_margin_is_relative_to_the_loser_lower_is_better() -> None:
    # latency: A 1.0 vs B 1.2 (A wins by 0.2 > 10% of 1.2); then A 1.2 vs B 1.05 (B wins by 0.15 > 0.12)
    assert stats.classify_reversal(pd(1.0, 1.2, -0.3, -0.1), pd(1.2, 1.05, 0.1, 0.2), False) == SUPPORTED
    # second lead 0.1 < 10% of the loser's 1.2: microscopic
    assert stats.classify_reversal(pd(1.0, 1.2, -0.3, -0.1), pd(1.2, 1.1, 0.05, 0.15), False) == MICROSCOPIC


def test_reversal_pvalue_is_the_larger() -> None:
    assert stats.reversal_pvalue(PairedDiff(1, 0, 0.1, 1, 0.01), PairedDiff(0, 1, -1, -0.1, 0.04)) == 0.04


# --- Benjamini-Hochberg ---------------------------------------------------------------------------
BH_EXAMPLE = [
    0.0001,
    0.0004,
    0.0019,
    0.0095,
    0.0201,
    0.0278,
    0.0298,
    0.0344,
    0.0459,
    0.3240,
    0.4262,
    0.5719,
    0.6528,
    0.7590,
    1.0000,
]
"""Benjamini & Hochberg (1995), section 4: 15 p-values; at q = 0.05 the first four are rejected
(the largest i with p_(i) <= i/15 * 0.05 is i = 4, since 0.0095 <= 0.0133 and 0.0201 > 0.0167)."""


def test_bh_worked_example() -> None:
    rejected, adjusted = stats.benjamini_hochberg(BH_EXAMPLE, 0.05)
    assert list(rejected) == [True] * 4 + [False] * 11
    assert np.allclose(adjusted, scipy.stats.false_discovery_control(BH_EXAMPLE, method="bh"))


def test_bh_is_order_free_and_step_up() -> None:
    shuffled = [BH_EXAMPLE[i] for i in (5, 0, 14, 3, 1, 2, 9, 4, 6, 7, 8, 10, 11, 12, 13)]
    rejected, _ = stats.benjamini_hochberg(shuffled, 0.05)
    assert sorted(p for p, r in zip(shuffled, rejected, strict=True) if r) == BH_EXAMPLE[:4]
    # step-up: 0.04 alone fails 0.05/2 but both pass because p_(2) = 0.04 <= 0.05
    assert list(stats.benjamini_hochberg([0.04, 0.03], 0.05)[0]) == [True, True]


def test_apply_fdr_downgrades_unsupported() -> None:
    out = stats.apply_fdr([SUPPORTED, SUPPORTED, STABLE], [0.001, 0.9, 0.5], q=0.05)
    assert out == [SUPPORTED, MICROSCOPIC, STABLE]


# --- cross-metric and sample complexity -------------------------------------------------------------
def test_cross_metric_orients_and_detects_top_change() -> None:
    goodput = {"a": 0.9, "b": 0.8, "c": 0.7}
    latency = {"a": 1.0, "b": 2.0, "c": 3.0}  # lower is better: same order
    cm = stats.cross_metric({"g": goodput, "l": latency}, {"g": True, "l": False})
    assert cm.tau[("g", "l")] == pytest.approx(1.0)
    assert not cm.top_changes
    cm2 = stats.cross_metric({"g": goodput, "l": {"a": 3.0, "b": 2.0, "c": 1.0}}, {"g": True, "l": False})
    assert cm2.tau[("g", "l")] == pytest.approx(-1.0)
    assert cm2.top_changes


def test_sample_complexity_recovers_separated_rankings() -> None:
    rng = np.random.default_rng(0)
    per_window = {
        "a": 10 + rng.normal(0, 0.01, 40),
        "b": 5 + rng.normal(0, 0.01, 40),
        "c": rng.normal(0, 0.01, 40),
    }
    rec = stats.sample_complexity(per_window, True, [5, 40], draws=200, seed=1)
    assert all(r.full_ranking == 1.0 and r.top == 1.0 for r in rec)


def test_sample_complexity_improves_with_windows_and_excludes_undefined() -> None:
    rng = np.random.default_rng(0)
    per_window = {"a": 1.0 + rng.normal(0, 1, 40), "b": rng.normal(0, 1, 40), "x": np.full(40, math.nan)}
    rec = stats.sample_complexity(per_window, True, [5, 40], draws=500, seed=2)
    assert rec[0].top < rec[1].top
    assert stats.sample_complexity(per_window, True, [5], draws=10, seed=2) == stats.sample_complexity(
        {k: v for k, v in per_window.items() if k != "x"}, True, [5], draws=10, seed=2
    )
