"""What the rankings leave out: undefined values are never imputed, only counted."""

from __future__ import annotations

import math

from sagegate.study.analysis import Dataset
from sagegate.study.metrics import METRIC_NAMES
from sagegate.study.report.text import join_words, table


def exclusions_section(ds: Dataset) -> list[str]:
    rows = [[m, ds.exclusions(m)] for m in METRIC_NAMES]
    lines = ["## Exclusions", ""]
    lines.append(
        "An undefined value (no request finished; Jain's index with a single tenant) is never imputed: the "
        "entry leaves that condition's ranking for that metric. (condition, entry) pairs excluded per "
        "metric:"
    )
    lines.append("")
    lines += table(["metric", "excluded"], rows)
    undefined = sorted(
        {
            f"{e} in {src}/{reg}"
            for src in ds.sources
            for reg in ds.regions
            for e, v in ds.means(src, reg, "ttlt_mean").items()
            if not math.isfinite(v)
        }
    )
    if undefined:
        lines += [
            "Entries with a window where no request finished (latencies undefined): "
            + join_words(undefined[:20])
            + ".",
            "",
        ]
    return lines
