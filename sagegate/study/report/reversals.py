"""Reversals between sources: pairs of entries whose order flips, classed stable, microscopic or
supported."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sagegate.study import analysis, figures
from sagegate.study.analysis import Dataset
from sagegate.study.metrics import METRIC_NAMES
from sagegate.study.report.text import pct, table
from sagegate.study.stats import MICROSCOPIC, STABLE, SUPPORTED
from sagegate.study.sweep import VLLM_ALONE

HEAVY = ("POST_KNEE", "OVERLOAD", "HIGH_PRESSURE", "U110")


def load_ends(regions: Sequence[tuple[str, float]], present: Sequence[str]) -> tuple[str, list[str]]:
    """The lightest region present and the two heaviest: LSSP's LOW and OVERLOAD / HIGH_PRESSURE when a
    run uses LSSP's regions, their counterparts by load when it does not."""
    by_load = [name for name, _ in sorted(regions, key=lambda r: r[1]) if name in present]
    if not by_load:
        return "LOW", ["OVERLOAD", "HIGH_PRESSURE"]
    return by_load[0], by_load[-2:]


def reversals_section(ds: Dataset, figdir: Path) -> tuple[list[str], dict[str, Any]]:
    recs = analysis.reversals(ds, METRIC_NAMES)
    lines = ["## Reversals between sources", ""]
    lines.append(
        "A record is one pair of entries compared in one region between two sources. **Supported practical "
        f"reversal**: the order flips, the winner leads by more than {pct(ds.cfg.margin, 0)} of the loser's "
        f"value in both sources, the {pct(ds.cfg.confidence, 0)} whole-window bootstrap interval "
        f"({ds.cfg.bootstrap} resamples) of the per-window paired difference excludes 0 in both, and the "
        f"record survives Benjamini–Hochberg at q = {ds.cfg.fdr_q:g} within its (metric, region) family "
        "(p-value: the larger of the two conditions' bootstrap p-values). A flip that fails any of these is "
        "a **microscopic sign change**."
    )
    lines.append("")
    anwg = [r for r in recs if r.metric == "anwg"]
    counts = analysis.reversal_counts(anwg, ds.regions)
    rows = []
    for region in ds.regions:
        c = counts[region]
        pre = sum(1 for r in anwg if r.region == region and r.pre_fdr == SUPPORTED)
        rows.append([region, sum(c.values()), c[STABLE], c[MICROSCOPIC], c[SUPPORTED], pre])
    tot = Counter(r.cls for r in anwg)
    n = len(anwg)
    rows.append(
        [
            "**all**",
            n,
            tot[STABLE],
            tot[MICROSCOPIC],
            tot[SUPPORTED],
            sum(r.pre_fdr == SUPPORTED for r in anwg),
        ]
    )
    lines += ["### ANWG", ""]
    lines += table(["region", "records", "stable", "microscopic", "supported", "supported before BH"], rows)
    path = figures.reversal_bars(
        counts, "Reversals between sources by region (ANWG)", figdir / "reversals_anwg.png"
    )
    lines += [f"![reversals by region]({path.parent.name}/{path.name})", ""]
    pairs = Counter(tuple(sorted((r.p1, r.p2))) for r in anwg if r.cls == SUPPORTED)
    src_pairs = Counter((r.source_a, r.source_b) for r in anwg if r.cls == SUPPORTED)
    if pairs:
        lines.append(
            "Most frequent supported pairs: "
            + "; ".join(f"{a} vs {b} ({k})" for (a, b), k in pairs.most_common(6))
            + ". Source pairs involved: "
            + "; ".join(f"{a}–{b} ({k})" for (a, b), k in src_pairs.most_common())
            + "."
        )
        lines.append("")
    light, _ = load_ends(ds.cfg.regions, ds.regions)
    heavy_here = [r for r in HEAVY if r in ds.regions]
    mrows = []
    for m in METRIC_NAMES:
        rs = [r for r in recs if r.metric == m]
        if not rs:
            continue
        c = Counter(r.cls for r in rs)
        heavy = sum(1 for r in rs if r.cls == SUPPORTED and r.region in heavy_here)
        low = sum(1 for r in rs if r.cls == SUPPORTED and r.region == light)
        mrows.append([m, len(rs), c[MICROSCOPIC], c[SUPPORTED], pct(c[SUPPORTED] / len(rs)), low, heavy])
    lines += ["### Every metric", ""]
    lines += table(
        [
            "metric",
            "records",
            "microscopic",
            "supported",
            "supported share",
            f"at {light}",
            f"at {'/'.join(heavy_here)}",
        ],
        mrows,
    )
    slai = [r for r in anwg if {r.p1, r.p2} == {"slai@engine", VLLM_ALONE.label}]
    summary = {
        "records": n,
        "supported": tot[SUPPORTED],
        "microscopic": tot[MICROSCOPIC],
        "stable": tot[STABLE],
        "by_region": {r: counts[r][SUPPORTED] for r in ds.regions},
        "top_pairs": pairs.most_common(3),
        "slai": Counter(r.cls for r in slai),
        "sources": Counter(x for r in anwg if r.cls == SUPPORTED for x in (r.source_a, r.source_b)),
        "ttlt": Counter(r.cls for r in recs if r.metric == "ttlt_mean"),
    }
    return lines, summary
