"""From result rows to the study's findings: condition tables, cross-source agreement, reversals,
cross-metric disagreement, sample complexity and the SageSched questions.

A *condition* is (source, region) under one predictor setting; within it every entry of the panel
has one value per window and metric. An entry with an undefined value in any window of a condition
leaves that condition's ranking for that metric (counted in :attr:`Dataset.exclusions`).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from sagegate.study import stats
from sagegate.study.config import StudyConfig
from sagegate.study.metrics import HIGHER_IS_BETTER, METRIC_NAMES
from sagegate.study.sweep import NOISY, VLLM_ALONE, predictor_label

Key = tuple[str, str, str]  # (source, region, predictor label)


@dataclass
class Dataset:
    """Per-window values of every cell, indexed for the analyses."""

    cfg: StudyConfig
    sources: list[str]
    regions: list[str]
    entries: list[str]
    windows: dict[str, list[int]]
    cube: dict[Key, dict[str, dict[str, np.ndarray]]]
    oracle_entries: set[str] = field(default_factory=set)
    dependent: set[str] = field(default_factory=set)
    utilisation: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @property
    def main(self) -> str:
        return predictor_label(NOISY, self.cfg.main_error)

    def per_window(
        self, source: str, region: str, metric: str, pred: str | None = None, *, oracles: bool = False
    ) -> dict[str, np.ndarray]:
        """Entry → per-window values. The oracles (bounds, not schedulers) are left out unless
        ``oracles``. At a non-main predictor setting, entries that do not read the prediction use their
        (only) main-setting cells; dependent entries not run there are absent."""
        pred = pred or self.main
        own = self.cube.get((source, region, pred), {})
        base = self.cube.get((source, region, self.main), {})
        out = {}
        for e in self.entries:
            if e in self.oracle_entries and not oracles:
                continue
            if e in own:
                out[e] = own[e][metric]
            elif pred != self.main and e not in self.dependent and e in base:
                out[e] = base[e][metric]
        return out

    def means(
        self, source: str, region: str, metric: str, pred: str | None = None, *, oracles: bool = False
    ) -> dict[str, float]:
        """Entry → mean over windows; NaN when any window's value is undefined."""
        return {
            e: float(v.mean()) if np.all(np.isfinite(v)) else math.nan
            for e, v in self.per_window(source, region, metric, pred, oracles=oracles).items()
        }

    def exclusions(self, metric: str, pred: str | None = None) -> int:
        """(condition, entry) pairs left out of ``metric``'s rankings for an undefined value."""
        return sum(
            not math.isfinite(v)
            for s in self.sources
            for r in self.regions
            for v in self.means(s, r, metric, pred).values()
        )


def load(rows: Iterable[Mapping[str, Any]], cfg: StudyConfig) -> Dataset:
    """Index result rows (from the sweep's store or the results CSV)."""
    from sagegate.policies.capabilities import Capability
    from sagegate.policies.registry import registry

    rows = list(rows)
    reg = registry()
    sources = [s.name for s in cfg.sources if any(r["source"] == s.name for r in rows)]
    regions = [name for name, _ in cfg.regions if any(r["region"] == name for r in rows)]
    windows: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        windows[r["source"]].add(int(r["window"]))
    wins = {s: sorted(v) for s, v in windows.items()}
    pos = {s: {w: i for i, w in enumerate(ws)} for s, ws in wins.items()}
    order: dict[str, tuple[str, str]] = {}
    for r in rows:
        order.setdefault(r["entry"], (r["policy"], r["level"]))
    entries = sorted(order)
    cube: dict[Key, dict[str, dict[str, np.ndarray]]] = {}
    util: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in rows:
        s = r["source"]
        key = (s, r["region"], predictor_label(r["predictor"], float(r["error"])))
        per_entry = cube.setdefault(key, {})
        if r["entry"] not in per_entry:
            per_entry[r["entry"]] = {m: np.full(len(wins[s]), np.nan) for m in METRIC_NAMES}
        i = pos[s][int(r["window"])]
        for m in METRIC_NAMES:
            v = r.get(m)
            per_entry[r["entry"]][m][i] = math.nan if v is None or v == "" else float(v)
        util[(s, r["region"])][int(r["window"])] = float(r["utilisation"])
    oracle = {
        e for e, (p, _) in order.items() if p in reg and Capability.USES_ORACLE in reg[p].cls.capabilities
    }
    dependent = {
        e
        for e, (p, lvl) in order.items()
        if lvl == "gateway" or (p in reg and Capability.USES_PREDICTION in reg[p].cls.capabilities)
    }
    utilisation = {k: np.array([v[w] for w in sorted(v)]) for k, v in util.items()}
    return Dataset(cfg, sources, regions, entries, wins, cube, oracle, dependent, utilisation)


def condition_seed(cfg: StudyConfig, source: str, region: str) -> int:
    return int(
        np.random.SeedSequence([cfg.stats_seed, zlib.crc32(f"{source}|{region}".encode())]).generate_state(1)[
            0
        ]
    )


def _indices(ds: Dataset, source: str, region: str) -> np.ndarray:
    return stats.bootstrap_indices(
        len(ds.windows[source]), ds.cfg.bootstrap, condition_seed(ds.cfg, source, region)
    )


# --- cross-source agreement ---------------------------------------------------------------------
@dataclass(frozen=True)
class SourcePairAgreement:
    region: str
    a: str
    b: str
    agreement: stats.Agreement


def cross_source(ds: Dataset, metric: str = "anwg", pred: str | None = None) -> list[SourcePairAgreement]:
    hib = HIGHER_IS_BETTER[metric]
    out = []
    for region in ds.regions:
        for a, b in combinations(ds.sources, 2):
            ag = stats.compare(ds.means(a, region, metric, pred), ds.means(b, region, metric, pred), hib)
            out.append(SourcePairAgreement(region, a, b, ag))
    return out


# --- reversals ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReversalRecord:
    metric: str
    region: str
    source_a: str
    source_b: str
    p1: str
    p2: str
    pre_fdr: str
    cls: str
    p: float
    diff_a: float
    diff_b: float


def _pair_evidence(
    ds: Dataset, source: str, region: str, metric: str, pred: str | None
) -> dict[tuple[str, str], stats.PairedDiff]:
    """Paired bootstrap of every pair of defined entries in one condition (shared resample indices)."""
    vals = {e: v for e, v in ds.per_window(source, region, metric, pred).items() if np.all(np.isfinite(v))}
    names = sorted(vals)
    if len(names) < 2:
        return {}
    idx = _indices(ds, source, region)
    mat = np.asarray([vals[n] for n in names])
    boot = stats.bootstrap_means(mat, idx)  # (P, R)
    means = mat.mean(axis=1)
    alpha = 0.5 * (1.0 - ds.cfg.confidence)
    out = {}
    ii, jj = np.triu_indices(len(names), 1)
    diffs = boot[ii] - boot[jj]  # (pairs, R)
    lo, hi = np.percentile(diffs, [100 * alpha, 100 * (1 - alpha)], axis=1)
    b = diffs.shape[1]
    le = (np.count_nonzero(diffs <= 0, axis=1) + 1) / (b + 1)
    ge = (np.count_nonzero(diffs >= 0, axis=1) + 1) / (b + 1)
    pv = np.minimum(1.0, 2.0 * np.minimum(le, ge))
    for k, (i, j) in enumerate(zip(ii, jj, strict=True)):
        out[(names[i], names[j])] = stats.PairedDiff(
            float(means[i]), float(means[j]), float(lo[k]), float(hi[k]), float(pv[k])
        )
    return out


def reversals(ds: Dataset, metrics: Sequence[str], pred: str | None = None) -> list[ReversalRecord]:
    """Every (policy pair × source pair) record per (metric, region), classified; BH within each
    (metric, region) family over all of its records."""
    out: list[ReversalRecord] = []
    for metric in metrics:
        hib = HIGHER_IS_BETTER[metric]
        for region in ds.regions:
            ev = {s: _pair_evidence(ds, s, region, metric, pred) for s in ds.sources}
            family: list[tuple[str, str, str, str, str, float, float, float]] = []
            for sa, sb in combinations(ds.sources, 2):
                for pair in sorted(set(ev[sa]) & set(ev[sb])):
                    d1, d2 = ev[sa][pair], ev[sb][pair]
                    cls = stats.classify_reversal(d1, d2, hib, ds.cfg.margin)
                    family.append(
                        (sa, sb, pair[0], pair[1], cls, stats.reversal_pvalue(d1, d2), d1.diff, d2.diff)
                    )
            if not family:
                continue
            final = stats.apply_fdr([f[4] for f in family], [f[5] for f in family], ds.cfg.fdr_q)
            for f, cls in zip(family, final, strict=True):
                out.append(
                    ReversalRecord(metric, region, f[0], f[1], f[2], f[3], f[4], cls, f[5], f[6], f[7])
                )
    return out


def reversal_counts(records: Sequence[ReversalRecord], regions: Sequence[str]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {r: Counter() for r in regions}
    for rec in records:
        out[rec.region][rec.cls] += 1
    return out


# --- cross-metric -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CrossMetricSummary:
    median_tau: float
    top_change_share: float
    conditions: int
    matrix: dict[tuple[str, str], float]  # median over conditions per metric pair


def cross_metric(
    ds: Dataset, metrics: Sequence[str] = METRIC_NAMES, pred: str | None = None
) -> CrossMetricSummary:
    taus: dict[tuple[str, str], list[float]] = defaultdict(list)
    changes = []
    for s in ds.sources:
        for r in ds.regions:
            by_metric = {m: ds.means(s, r, m, pred) for m in metrics}
            cm = stats.cross_metric(by_metric, HIGHER_IS_BETTER)
            if cm.metrics < 2:
                continue
            changes.append(cm.top_changes)
            for k, t in cm.tau.items():
                if math.isfinite(t):
                    taus[k].append(t)
    all_t = [t for ts in taus.values() for t in ts]
    matrix = {k: float(np.median(v)) for k, v in taus.items()}
    return CrossMetricSummary(
        float(np.median(all_t)) if all_t else math.nan,
        float(np.mean(changes)) if changes else math.nan,
        len(changes),
        matrix,
    )


# --- sample complexity --------------------------------------------------------------------------
def sample_complexity(ds: Dataset, metric: str, pred: str | None = None) -> dict[int, dict[str, float]]:
    """Recovery rates per window count, averaged over conditions."""
    acc: dict[int, list[stats.Recovery]] = defaultdict(list)
    sizes = [n for n in ds.cfg.subsample_sizes]
    for s in ds.sources:
        for r in ds.regions:
            rec = stats.sample_complexity(
                ds.per_window(s, r, metric, pred),
                HIGHER_IS_BETTER[metric],
                sizes,
                ds.cfg.subsample_draws,
                condition_seed(ds.cfg, s, r),
            )
            for x in rec:
                acc[x.n].append(x)
    return {
        n: {
            "full_ranking": float(np.nanmean([x.full_ranking for x in xs])),
            "top": float(np.nanmean([x.top for x in xs])),
            "mean_tau": float(np.nanmean([x.mean_tau for x in xs])),
        }
        for n, xs in sorted(acc.items())
    }


# --- SageSched and the gateway --------------------------------------------------------------------
@dataclass(frozen=True)
class Standing:
    """One entry's place in one condition's ranking of deployable entries under one metric."""

    source: str
    region: str
    entry: str
    rank: int
    of: int
    top: bool
    runner_up: str
    lead: float  # relative lead over the best other entry (positive: ahead); NaN if undefined
    diff: stats.PairedDiff | None


def standing(
    ds: Dataset, entry: str, metric: str, pred: str | None = None, among: set[str] | None = None
) -> list[Standing]:
    """``entry``'s rank (1 = best) among deployable entries (no oracles), per condition, with its lead
    over the best other entry and the paired bootstrap of that difference."""
    hib = HIGHER_IS_BETTER[metric]
    out = []
    for s in ds.sources:
        for r in ds.regions:
            pw = {
                e: v
                for e, v in ds.per_window(s, r, metric, pred).items()
                if e not in ds.oracle_entries
                and (among is None or e in among or e == entry)
                and np.all(np.isfinite(v))
            }
            if entry not in pw or len(pw) < 2:
                continue
            means = {e: float(v.mean()) for e, v in pw.items()}
            order = stats.ranking(means, hib)
            others = [e for e in order if e != entry]
            best_other = others[0]
            mine, theirs = means[entry], means[best_other]
            lead = (theirs - mine) / abs(theirs) if theirs != 0 else math.nan
            if hib:
                lead = -lead
            rank = 1 + sum(1 for e in others if (means[e] > mine if hib else means[e] < mine))
            diff = stats.paired_diff(pw[entry], pw[best_other], _indices(ds, s, r), ds.cfg.confidence)
            out.append(Standing(s, r, entry, rank, len(order), rank == 1, best_other, lead, diff))
    return out


def robustness_comparators(ds: Dataset, exclude: Iterable[str]) -> set[str]:
    """Entries that can be compared at every predictor error: re-run ones and prediction-free ones."""
    skip = set(exclude) | ds.oracle_entries
    errs = [predictor_label(NOISY, e) for e in ds.cfg.errors]
    present = set(ds.entries)
    for pred in errs:
        here = set()
        for s in ds.sources:
            for r in ds.regions:
                here |= set(ds.per_window(s, r, "ttlt_mean", pred))
        present &= here
    return present - skip


@dataclass(frozen=True)
class GatewayVsVllm:
    source: str
    region: str
    entry: str
    metric: str
    diff: stats.PairedDiff  # entry − vLLM alone
    worse: bool
    significant: bool


def gateway_vs_vllm(ds: Dataset, metrics: Sequence[str], pred: str | None = None) -> list[GatewayVsVllm]:
    """Every gateway entry against vLLM alone (``vllm-v1@engine``), per condition and metric."""
    ref = VLLM_ALONE.label
    out = []
    for metric in metrics:
        hib = HIGHER_IS_BETTER[metric]
        for s in ds.sources:
            for r in ds.regions:
                pw = ds.per_window(s, r, metric, pred)
                if ref not in pw or not np.all(np.isfinite(pw[ref])):
                    continue
                idx = _indices(ds, s, r)
                for e, v in pw.items():
                    if not e.endswith("@gateway") or not np.all(np.isfinite(v)) or e in ds.oracle_entries:
                        continue
                    d = stats.paired_diff(v, pw[ref], idx, ds.cfg.confidence)
                    worse = d.diff < 0 if hib else d.diff > 0
                    out.append(GatewayVsVllm(s, r, e, metric, d, worse, worse and d.excludes_zero))
    return out
