"""The report's PNG figures (matplotlib, Agg backend): one function per figure, data in, file out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ranking_heatmap(
    ranks: Mapping[tuple[str, str], Mapping[str, float]],
    columns: Sequence[tuple[str, str]],
    entries: Sequence[str],
    title: str,
    path: Path,
) -> Path:
    """Rows: entries; columns: (source, region); colour: rank (1 = best), blank when excluded."""
    plt = _plt()
    mat = np.array([[ranks.get(c, {}).get(e, math.nan) for c in columns] for e in entries], dtype=float)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(columns) + 3), max(4.0, 0.26 * len(entries) + 1.5)))
    im = ax.imshow(np.ma.masked_invalid(mat), aspect="auto", cmap="viridis_r", interpolation="nearest")
    ax.set_yticks(range(len(entries)), entries, fontsize=7)
    ax.set_xticks(range(len(columns)), [f"{s}\n{r}" for s, r in columns], fontsize=6, rotation=90)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="rank (1 = best)", shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tau_matrices(
    taus: Mapping[str, Mapping[tuple[str, str], float]], sources: Sequence[str], title: str, path: Path
) -> Path:
    """One source × source tau-b matrix per region (diagonal 1)."""
    plt = _plt()
    regions = list(taus)
    cols = min(3, max(1, len(regions)))
    rows = math.ceil(len(regions) / cols)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(4.2 * cols, 3.8 * rows),
        squeeze=False,
        gridspec_kw={"wspace": 0.08, "hspace": 0.45},
    )
    n = len(sources)
    im = None
    for k, region in enumerate(regions):
        ax = axes[k // cols][k % cols]
        mat = np.eye(n)
        for (a, b), t in taus[region].items():
            i, j = sources.index(a), sources.index(b)
            mat[i, j] = mat[j, i] = t
        im = ax.imshow(np.ma.masked_invalid(mat), vmin=-1, vmax=1, cmap="RdBu")
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    "–" if math.isnan(mat[i, j]) else f"{mat[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        ax.set_xticks(range(n), sources, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(n), sources if k % cols == 0 else [""] * n, fontsize=7)
        ax.set_title(region, fontsize=9)
    for k in range(len(regions), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes, label="Kendall tau-b", shrink=0.7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def reversal_bars(counts: Mapping[str, Mapping[str, int]], title: str, path: Path) -> Path:
    """Microscopic sign changes and supported practical reversals per region."""
    plt = _plt()
    regions = list(counts)
    x = np.arange(len(regions))
    micro = [counts[r].get("microscopic", 0) for r in regions]
    sup = [counts[r].get("supported", 0) for r in regions]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(x - 0.2, micro, 0.4, label="microscopic sign change", color="#9ecae1")
    ax.bar(x + 0.2, sup, 0.4, label="supported practical reversal", color="#de2d26")
    ax.set_xticks(x, regions, fontsize=8)
    ax.set_ylabel("records")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def metric_matrix(
    matrix: Mapping[tuple[str, str], float], metrics: Sequence[str], title: str, path: Path
) -> Path:
    """Median tau-b between the rankings under each pair of metrics."""
    plt = _plt()
    n = len(metrics)
    mat = np.eye(n)
    for (a, b), t in matrix.items():
        if a in metrics and b in metrics:
            i, j = metrics.index(a), metrics.index(b)
            mat[i, j] = mat[j, i] = t
    for i in range(n):
        if not any(
            m in matrix for m in [(metrics[i], x) for x in metrics] + [(x, metrics[i]) for x in metrics]
        ):
            mat[i, :] = mat[:, i] = math.nan
    fig, ax = plt.subplots(figsize=(0.5 * n + 3, 0.5 * n + 2))
    im = ax.imshow(np.ma.masked_invalid(mat), vmin=-1, vmax=1, cmap="RdBu")
    for i in range(n):
        for j in range(n):
            if not math.isnan(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(n), metrics, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(n), metrics, fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="median Kendall tau-b", shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def robustness_lines(leads: Mapping[str, Mapping[float, float]], title: str, path: Path) -> Path:
    """Median relative lead of each SageSched entry over the best comparator, per prediction error."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for label, by_err in leads.items():
        errs = sorted(by_err)
        style = "--" if "vLLM" in label else "-"
        ax.plot([100 * e for e in errs], [100 * by_err[e] for e in errs], style, marker="o", label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("prediction error (%)")
    ax.set_ylabel("median lead in mean TTLT (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
