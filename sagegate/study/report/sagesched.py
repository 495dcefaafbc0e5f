"""Does SageSched top mean TTLT? Its standing per condition, within its level and against vLLM alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from sagegate.study import analysis
from sagegate.study.analysis import Dataset
from sagegate.study.report.text import competition_ranks, fmt, join_words, pct, table
from sagegate.study.sweep import VLLM_ALONE


def sagesched_section(ds: Dataset) -> tuple[list[str], dict[str, Any]]:
    lines = ["## Does SageSched top mean TTLT?", ""]
    found: dict[str, Any] = {}
    entries = [e for e in ("sagesched@gateway", "sagesched@engine") if e in ds.entries]
    if not entries:
        return [*lines, "`sagesched` is not in this run's panel.", ""], found
    lines.append(
        "Rank among deployable entries (the oracles left out) by mean TTLT at the main prediction setting "
        f"({ds.main}); lead = relative margin over the best other entry (positive: SageSched ahead), with "
        "the bootstrap interval of the per-window paired difference (SageSched − runner-up, seconds). Also "
        "its rank among the entries of its own level, and its margin over vLLM alone (`vllm-v1@engine`; * = "
        "the paired interval excludes 0)."
    )
    lines.append("")
    ref = VLLM_ALONE.label
    for entry in entries:
        level = entry.rpartition("@")[2]
        st = analysis.standing(ds, entry, "ttlt_mean")
        same = {e for e in ds.entries if e.endswith("@" + level)}
        by_level = {(x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean", among=same)}
        vs_ref = {(x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean", among={ref})}
        found[entry] = st
        rows = []
        for x in st:
            lv, vr = by_level.get((x.source, x.region)), vs_ref.get((x.source, x.region))
            rows.append(
                [
                    x.source,
                    x.region,
                    f"{x.rank}/{x.of}",
                    x.runner_up,
                    pct(x.lead),
                    f"[{fmt(x.diff.lo)}, {fmt(x.diff.hi)}]" if x.diff else "–",
                    f"{lv.rank}/{lv.of}" if lv else "–",
                    (pct(vr.lead) + ("*" if vr.diff is not None and vr.diff.excludes_zero else ""))
                    if vr
                    else "–",
                ]
            )
        lines += [f"### {entry}", ""]
        lines += table(
            [
                "source",
                "region",
                "rank",
                "best other",
                "lead",
                "95% CI of difference (s)",
                f"rank at {level} level",
                "lead over vLLM alone",
            ],
            rows,
        )
        tops = [f"{x.source}/{x.region}" for x in st if x.top]
        sig = [f"{x.source}/{x.region}" for x in st if x.top and x.diff is not None and x.diff.excludes_zero]
        level_tops = [f"{x.source}/{x.region}" for x in by_level.values() if x.top]
        ahead = [x for x in vs_ref.values() if x.lead > 0 and x.diff is not None and x.diff.excludes_zero]
        behind = [x for x in vs_ref.values() if x.lead < 0 and x.diff is not None and x.diff.excludes_zero]
        lines.append(
            f"`{entry}` tops mean TTLT in {len(tops)} of {len(st)} conditions"
            + (f" ({join_words(tops)})" if tops else "")
            + f"; its lead is statistically supported (interval excludes 0) in {len(sig)}"
            + (f" ({join_words(sig)})" if sig else "")
            + f". Among {level}-level entries it is best in {len(level_tops)} of {len(by_level)}"
            + (f" ({join_words(level_tops)})" if level_tops and len(level_tops) <= 8 else "")
            + f". Against vLLM alone it is supported-faster in {len(ahead)} and supported-slower in "
            f"{len(behind)} of {len(vs_ref)} conditions"
            + (
                f" (median margin {pct(float(np.median([x.lead for x in vs_ref.values()])))})"
                if vs_ref
                else ""
            )
            + "."
        )
        lines.append("")
    best: Counter[str] = Counter()
    for s in ds.sources:
        for r in ds.regions:
            means = {e: v for e, v in ds.means(s, r, "ttlt_mean").items() if e not in ds.oracle_entries}
            ranks = competition_ranks(means, False)
            best.update(e for e, k in ranks.items() if k == 1)
    lines.append(
        "Entries most often best on mean TTLT (deployable, ties counted for each): "
        + "; ".join(f"{e} ({k})" for e, k in best.most_common(5))
        + "."
    )
    lines.append("")
    found["best_counter"] = best
    return lines, found
