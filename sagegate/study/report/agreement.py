"""How far rankings agree: between sources on one metric, and between metrics on one condition."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sagegate.study import analysis, figures
from sagegate.study.analysis import Dataset
from sagegate.study.metrics import METRIC_NAMES
from sagegate.study.report.text import fmt, pct, table


def cross_source_section(ds: Dataset, figdir: Path) -> tuple[list[str], dict[str, float]]:
    lines = ["## Cross-source agreement", ""]
    recs = analysis.cross_source(ds, "anwg")
    lines.append(
        "For each region and pair of sources, the two rankings of the panel by mean ANWG compared with "
        "Kendall's tau-b (headline), Spearman's rho, top-1 agreement (the best entries, ties included, "
        "overlap) and top-3 overlap. Entries undefined in either ranking are excluded and counted. Here and "
        "in every statistic below the oracles (`sjf-oracle`, `srpt-oracle`: bounds, not schedulers) are "
        "left out; the rank heatmaps show them."
    )
    lines.append("")
    lines += table(
        ["region", "source A", "source B", "tau-b", "rho", "top-1", "top-3", "n", "excluded"],
        [
            [
                x.region,
                x.a,
                x.b,
                fmt(x.agreement.tau_b),
                fmt(x.agreement.rho),
                fmt(x.agreement.top1, 0),
                fmt(x.agreement.top3, 2),
                x.agreement.n,
                x.agreement.excluded,
            ]
            for x in recs
        ],
    )
    taus = [x.agreement.tau_b for x in recs if math.isfinite(x.agreement.tau_b)]
    undefined = sum(not math.isfinite(x.agreement.tau_b) for x in recs)
    summary = {
        "conditions": float(len(recs)),
        "undefined": float(undefined),
        "min": min(taus) if taus else math.nan,
        "max": max(taus) if taus else math.nan,
        "mean": float(np.mean(taus)) if taus else math.nan,
        "median": float(np.median(taus)) if taus else math.nan,
    }
    lines.append(
        f"Over {len(recs)} (source pair × region) conditions, tau-b on ANWG ranges from "
        f"{fmt(summary['min'], 2)} to {fmt(summary['max'], 2)} (mean {fmt(summary['mean'])}, median "
        f"{fmt(summary['median'])}); {undefined} condition(s) are undefined (every entry tied on one side) "
        "and excluded."
    )
    by_region = []
    for region in ds.regions:
        t = [x.agreement.tau_b for x in recs if x.region == region and math.isfinite(x.agreement.tau_b)]
        by_region.append(f"{region} {fmt(float(np.mean(t)), 2) if t else '–'}")
    lines += ["", "Mean tau-b by region: " + "; ".join(by_region) + ".", ""]
    ttlt = analysis.cross_source(ds, "ttlt_mean")
    tt = [x.agreement.tau_b for x in ttlt if math.isfinite(x.agreement.tau_b)]
    summary["ttlt_mean"] = float(np.mean(tt)) if tt else math.nan
    lines.append(
        f"On mean TTLT the same comparison gives tau-b from {fmt(min(tt) if tt else math.nan, 2)} to "
        f"{fmt(max(tt) if tt else math.nan, 2)} (mean {fmt(summary['ttlt_mean'])})."
    )
    taus_by_region = {
        region: {(x.a, x.b): x.agreement.tau_b for x in recs if x.region == region} for region in ds.regions
    }
    path = figures.tau_matrices(
        taus_by_region, ds.sources, "Cross-source Kendall tau-b on ANWG", figdir / "tau_anwg.png"
    )
    lines += ["", f"![tau-b matrices]({path.parent.name}/{path.name})", ""]
    return lines, summary


def cross_metric_section(ds: Dataset, figdir: Path) -> tuple[list[str], analysis.CrossMetricSummary]:
    cm = analysis.cross_metric(ds)
    lines = ["## Across metrics", ""]
    lines.append(
        "For each (source, region) condition, tau-b between the rankings under every pair of the "
        f"{len(METRIC_NAMES)} metrics (oriented so that agreement is positive). Over {cm.conditions} "
        f"conditions the median tau-b is {fmt(cm.median_tau)}, and the top entry changes with the metric (no "
        f"entry is best, ties included, under every metric) in {pct(cm.top_change_share)} of conditions."
    )
    lines.append("")
    path = figures.metric_matrix(
        cm.matrix, list(METRIC_NAMES), "Median tau-b between metrics", figdir / "metric_disagreement.png"
    )
    lines += [f"![metric disagreement]({path.parent.name}/{path.name})", ""]
    worst = sorted((t, a, b) for (a, b), t in cm.matrix.items() if math.isfinite(t))[:5]
    if worst:
        lines.append(
            "Least agreeing metric pairs (median tau-b): "
            + "; ".join(f"{a} vs {b} {fmt(t, 2)}" for t, a, b in worst)
            + "."
        )
        lines.append("")
    return lines, cm
