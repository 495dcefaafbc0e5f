"""The rankings per condition (rank heatmaps) and how many windows it takes to recover them."""

from __future__ import annotations

import math
from pathlib import Path

from sagegate.study import analysis, figures
from sagegate.study.analysis import Dataset
from sagegate.study.metrics import HIGHER_IS_BETTER, LABELS
from sagegate.study.report.text import competition_ranks, fmt, join_words, pct, table


def rankings_section(ds: Dataset, figdir: Path, metric: str) -> tuple[list[str], Path]:
    hib = HIGHER_IS_BETTER[metric]
    cols = [(s, r) for s in ds.sources for r in ds.regions]
    ranks = {c: competition_ranks(ds.means(c[0], c[1], metric, oracles=True), hib) for c in cols}
    path = figures.ranking_heatmap(
        ranks, cols, ds.entries, f"Rank by {LABELS[metric]} ({ds.main})", figdir / f"ranking_{metric}.png"
    )
    rows = []
    for s, r in cols:
        means = ds.means(s, r, metric, oracles=True)
        rk = ranks[(s, r)]
        top = sorted(rk, key=lambda e: (rk[e], e))[:3]
        distinct = len({round(v, 12) for v in means.values() if math.isfinite(v)})
        rows.append([s, r, join_words([f"{e} ({fmt(means[e])})" for e in top]), distinct])
    lines = [f"### {LABELS[metric]}", "", f"![rank heatmap]({path.parent.name}/{path.name})", ""]
    lines += table(["source", "region", "top 3 (mean over windows)", "distinct values"], rows)
    return lines, path


def sample_complexity_section(ds: Dataset) -> list[str]:
    lines = ["## Sample complexity", ""]
    lines.append(
        f"Windows drawn with replacement ({ds.cfg.subsample_draws} draws per size, per condition; averaged "
        "over conditions): how often the draw's ranking equals the all-window ranking exactly, how often "
        "its best entry is an all-window best entry, and its mean tau-b to the all-window ranking."
    )
    lines.append("")
    rows = []
    for metric in ("anwg", "ttlt_mean"):
        for n, v in analysis.sample_complexity(ds, metric).items():
            rows.append([metric, n, pct(v["full_ranking"]), pct(v["top"]), fmt(v["mean_tau"])])
    lines += table(["metric", "windows", "full ranking recovered", "top entry recovered", "mean tau-b"], rows)
    return lines
