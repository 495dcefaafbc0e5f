"""The study's statistics, pure functions over arrays (no I/O, every random draw from a given seed).

* rank agreement: Kendall's tau-b (headline) and Spearman's rho, top-1 and top-3 agreement; a policy
  whose value is undefined (NaN) in either ranking is excluded and counted, never imputed;
* whole-window bootstrap: windows resampled with replacement, percentile intervals;
* supported practical reversals: an order flip with a > ``margin`` lead and a bootstrap interval
  excluding 0 in both conditions, then Benjamini–Hochberg within a family;
* cross-metric disagreement and sample complexity.

Orientation: every function that orders policies takes ``higher_is_better``; internally values are
turned into *scores* (higher = better) so a positive tau always means agreement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

Values = Sequence[float] | np.ndarray
"""Per-window values or a ranking's values: a sequence or a 1-d array."""

STABLE = "stable"
MICROSCOPIC = "microscopic"
SUPPORTED = "supported"


# --- rank correlation ---------------------------------------------------------------------------
def _clean(x: Values, y: Values) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("x and y must be 1-d sequences of the same length")
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def kendall_tau_b(x: Values, y: Values) -> float:
    """Kendall's tau-b over the pairs where both values are finite; NaN when undefined (fewer than two
    pairs, or every value of either side tied)."""
    a, b = _clean(x, y)
    n = len(a)
    if n < 2:
        return math.nan
    iu = np.triu_indices(n, 1)
    da = np.sign(a[:, None] - a[None, :])[iu]
    db = np.sign(b[:, None] - b[None, :])[iu]
    s = float((da * db).sum())  # concordant − discordant
    n_a = float(np.count_nonzero(da))  # pairs not tied in x
    n_b = float(np.count_nonzero(db))
    if n_a == 0 or n_b == 0:
        return math.nan
    return s / math.sqrt(n_a * n_b)


def average_ranks(values: Values) -> np.ndarray:
    """Ranks 1..n of ``values`` (ascending), ties sharing their average rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    sorted_v = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def spearman_rho(x: Values, y: Values) -> float:
    """Spearman's rho (Pearson on average ranks) over the finite pairs; NaN when undefined."""
    a, b = _clean(x, y)
    if len(a) < 2:
        return math.nan
    ra, rb = average_ranks(a), average_ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    return float((ra * rb).sum()) / den if den > 0 else math.nan


# --- rankings -----------------------------------------------------------------------------------
def scores(values: Mapping[str, float], higher_is_better: bool) -> dict[str, float]:
    """Finite values turned into scores (higher = better)."""
    sign = 1.0 if higher_is_better else -1.0
    return {k: sign * float(v) for k, v in values.items() if math.isfinite(v)}


def ranking(values: Mapping[str, float], higher_is_better: bool) -> list[str]:
    """Policies best first (ties broken by name, so the order is deterministic); NaN values left out."""
    s = scores(values, higher_is_better)
    return sorted(s, key=lambda k: (-s[k], k))


def top_set(values: Mapping[str, float], higher_is_better: bool, rel_tol: float = 1e-12) -> set[str]:
    """Every policy tied for best (within ``rel_tol``); empty when no value is finite."""
    s = scores(values, higher_is_better)
    if not s:
        return set()
    best = max(s.values())
    tol = rel_tol * max(1.0, abs(best))
    return {k for k, v in s.items() if v >= best - tol}


@dataclass(frozen=True)
class Agreement:
    """Two rankings of the same policies compared over the ``n`` policies defined in both."""

    tau_b: float
    rho: float
    top1: float  # 1 if the best policies (ties included) overlap, else 0; NaN if n == 0
    top3: float  # |top-3 ∩ top-3| / 3 (ties broken by name)
    n: int
    excluded: int  # policies left out because a value was undefined in either ranking


def compare(a: Mapping[str, float], b: Mapping[str, float], higher_is_better: bool) -> Agreement:
    """Kendall tau-b, Spearman rho, top-1 and top-3 agreement of two rankings."""
    keys = sorted(set(a) | set(b))
    common = [k for k in keys if k in a and k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    excluded = len(keys) - len(common)
    x = [a[k] for k in common]
    y = [b[k] for k in common]
    if not common:
        return Agreement(math.nan, math.nan, math.nan, math.nan, 0, excluded)
    ca = {k: a[k] for k in common}
    cb = {k: b[k] for k in common}
    top1 = 1.0 if top_set(ca, higher_is_better) & top_set(cb, higher_is_better) else 0.0
    k = min(3, len(common))
    top3 = len(set(ranking(ca, higher_is_better)[:k]) & set(ranking(cb, higher_is_better)[:k])) / k
    return Agreement(kendall_tau_b(x, y), spearman_rho(x, y), top1, top3, len(common), excluded)


# --- bootstrap ----------------------------------------------------------------------------------
def bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples × n`` window indices drawn with replacement (whole-window bootstrap)."""
    if n < 1 or resamples < 1:
        raise ValueError("need n >= 1 and resamples >= 1")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_means(per_window: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Means over the resampled windows: ``per_window`` is ``(..., n)``, the result ``(..., resamples)``."""
    return np.asarray(per_window, dtype=float)[..., idx].mean(axis=-1)


def percentile_interval(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    alpha = 0.5 * (1.0 - confidence)
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)])
    return float(lo), float(hi)


def bootstrap_ci(
    per_window: Values, resamples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean over windows and its percentile bootstrap interval."""
    arr = np.asarray(per_window, dtype=float)
    means = bootstrap_means(arr, bootstrap_indices(len(arr), resamples, seed))
    lo, hi = percentile_interval(means, confidence)
    return float(arr.mean()), lo, hi


def bootstrap_pvalue(samples: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "the mean is 0": ``2·min(P*(≤0), P*(≥0))`` with the +1
    correction, so it is never 0."""
    s = np.asarray(samples, dtype=float)
    b = len(s)
    le = (np.count_nonzero(s <= 0) + 1) / (b + 1)
    ge = (np.count_nonzero(s >= 0) + 1) / (b + 1)
    return min(1.0, 2.0 * min(le, ge))


@dataclass(frozen=True)
class PairedDiff:
    """Mean over windows of ``a − b`` (values as measured, not scores) and its bootstrap evidence."""

    mean_a: float
    mean_b: float
    lo: float
    hi: float
    p: float

    @property
    def diff(self) -> float:
        return self.mean_a - self.mean_b

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def paired_diff(a: Values, b: Values, idx: np.ndarray, confidence: float = 0.95) -> PairedDiff:
    """Bootstrap of the per-window paired difference ``a − b`` with the given resample indices."""
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    samples = bootstrap_means(xa - xb, idx)
    lo, hi = percentile_interval(samples, confidence)
    return PairedDiff(float(xa.mean()), float(xb.mean()), lo, hi, bootstrap_pvalue(samples))


# --- reversals ----------------------------------------------------------------------------------
def _winner_leads(d: PairedDiff, higher_is_better: bool, margin: float) -> bool:
    """The better of the two leads by more than ``margin`` × the worse one's value."""
    a_wins = (d.mean_a > d.mean_b) == higher_is_better
    loser = d.mean_b if a_wins else d.mean_a
    return abs(d.diff) > margin * abs(loser)


def classify_reversal(d1: PairedDiff, d2: PairedDiff, higher_is_better: bool, margin: float = 0.10) -> str:
    """Before multiple-testing control: ``stable`` (same strict order, or a tie on either side),
    ``microscopic`` (the order flips but the flip is not supported) or ``supported`` (it flips, the
    winner leads by more than ``margin`` of the loser's value in both conditions and both bootstrap
    intervals of the paired difference exclude 0)."""
    s1, s2 = np.sign(d1.diff), np.sign(d2.diff)
    if s1 == 0 or s2 == 0 or s1 == s2:
        return STABLE
    practical = _winner_leads(d1, higher_is_better, margin) and _winner_leads(d2, higher_is_better, margin)
    if practical and d1.excludes_zero and d2.excludes_zero:
        return SUPPORTED
    return MICROSCOPIC


def reversal_pvalue(d1: PairedDiff, d2: PairedDiff) -> float:
    """Intersection-union p-value of "the order differs in both conditions": the larger of the two."""
    return max(d1.p, d2.p)


def benjamini_hochberg(pvalues: Sequence[float], q: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini–Hochberg step-up at FDR ``q``: ``(rejected, adjusted p-values)`` in input order."""
    p = np.asarray(pvalues, dtype=float)
    m = len(p)
    if m == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    order = np.argsort(p, kind="mergesort")
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    below = np.nonzero(p[order] <= q * np.arange(1, m + 1) / m)[0]
    rejected = np.zeros(m, dtype=bool)
    if len(below):
        rejected[order[: below[-1] + 1]] = True
    return rejected, adjusted


def apply_fdr(classes: Sequence[str], pvalues: Sequence[float], q: float = 0.05) -> list[str]:
    """Benjamini–Hochberg over one family's records: a ``supported`` reversal whose p-value is not
    rejected becomes ``microscopic``."""
    rejected, _ = benjamini_hochberg(pvalues, q)
    return [MICROSCOPIC if c == SUPPORTED and not r else c for c, r in zip(classes, rejected, strict=True)]


# --- across metrics -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CrossMetric:
    """One condition's rankings under every metric compared pairwise."""

    tau: dict[tuple[str, str], float]  # (metric, metric) → tau-b of the two score rankings
    top_changes: bool  # no single policy is best (ties included) under every metric
    metrics: int  # metrics with at least one defined value


def cross_metric(by_metric: Mapping[str, Mapping[str, float]], higher: Mapping[str, bool]) -> CrossMetric:
    """Tau-b between the rankings under each pair of metrics (scores, so agreement is positive), and
    whether the top policy changes with the metric."""
    sc = {m: scores(v, higher[m]) for m, v in by_metric.items()}
    sc = {m: s for m, s in sc.items() if s}
    tau = {}
    for m1, m2 in combinations(sorted(sc), 2):
        common = sorted(set(sc[m1]) & set(sc[m2]))
        tau[(m1, m2)] = kendall_tau_b([sc[m1][k] for k in common], [sc[m2][k] for k in common])
    tops = [top_set(s, True) for s in sc.values()]
    common_top = set.intersection(*tops) if tops else set()
    return CrossMetric(tau, bool(tops) and not common_top, len(sc))


# --- sample complexity --------------------------------------------------------------------------
@dataclass(frozen=True)
class Recovery:
    n: int
    full_ranking: float  # share of draws whose ranking equals the all-window ranking
    top: float  # share of draws whose best policy is an all-window best policy
    mean_tau: float  # mean tau-b between the draw's and the all-window ranking


def sample_complexity(
    per_window: Mapping[str, Values],
    higher_is_better: bool,
    sizes: Sequence[int],
    draws: int,
    seed: int,
) -> list[Recovery]:
    """How often ``n`` windows drawn with replacement recover the all-window ranking and top policy.

    Policies with an undefined value in any window are left out (never imputed). Drawing with
    replacement keeps ``n`` = all windows informative: it then measures the ranking's own stability.
    """
    names = sorted(k for k, v in per_window.items() if np.all(np.isfinite(np.asarray(v, dtype=float))))
    if not names:
        return [Recovery(n, math.nan, math.nan, math.nan) for n in sizes]
    sign = 1.0 if higher_is_better else -1.0
    mat = sign * np.asarray([per_window[k] for k in names], dtype=float)  # (P, W) scores
    full = mat.mean(axis=1)
    full_order = _order(full)
    best = set(np.flatnonzero(full >= full.max() - 1e-12 * max(1.0, abs(full.max()))))
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        idx = rng.integers(0, mat.shape[1], size=(draws, n))
        means = mat[:, idx].mean(axis=2).T  # (draws, P)
        same = top = 0
        taus = []
        for row in means:
            same += bool(np.array_equal(_order(row), full_order))
            top += int(np.argmax(row)) in best
            t = kendall_tau_b(row, full)
            if math.isfinite(t):
                taus.append(t)
        out.append(Recovery(n, same / draws, top / draws, float(np.mean(taus)) if taus else math.nan))
    return out


def _order(score: np.ndarray) -> np.ndarray:
    """Indices best first, ties by index (policy name order)."""
    return np.lexsort((np.arange(len(score)), -score))
