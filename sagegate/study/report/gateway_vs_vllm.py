"""Where a gateway-level policy is worse (or better) than vLLM alone."""

from __future__ import annotations

from collections import Counter

from sagegate.study import analysis
from sagegate.study.analysis import Dataset
from sagegate.study.metrics import LABELS
from sagegate.study.report.text import join_words, table
from sagegate.study.sweep import VLLM_ALONE


def gateway_section(ds: Dataset) -> tuple[list[str], dict[tuple[str, str], int]]:
    lines = ["## Where is a gateway-level policy worse than vLLM alone?", ""]
    if VLLM_ALONE.label not in ds.entries:
        return [*lines, "`vllm-v1@engine` is not in this run's panel.", ""], {}
    metrics = ("anwg", "ttlt_mean", "ttft_p95")
    recs = analysis.gateway_vs_vllm(ds, metrics)
    lines.append(
        "Each gateway entry (the gateway's queue and memory-aware admission in front of an FCFS engine) "
        "against vLLM alone (`vllm-v1@engine`: no gateway queue), per condition; *worse* = a worse mean, "
        "*supported* = and the paired bootstrap interval excludes 0."
    )
    lines.append("")
    rows = []
    found: dict[tuple[str, str], int] = {}
    for metric in metrics:
        for region in ds.regions:
            rs = [r for r in recs if r.metric == metric and r.region == region]
            worse = [r for r in rs if r.worse]
            sig = [r for r in rs if r.significant]
            names = Counter(r.entry for r in sig)
            rows.append(
                [
                    metric,
                    region,
                    len(rs),
                    len(worse),
                    len(sig),
                    join_words([f"{e} ({k})" for e, k in names.most_common(4)]),
                ]
            )
            found[(metric, region)] = len(sig)
    lines += table(
        [
            "metric",
            "region",
            "(entry, source) records",
            "worse",
            "supported worse",
            "most often supported worse",
        ],
        rows,
    )
    for metric in metrics:
        regs = [r for r in ds.regions if found.get((metric, r), 0) > 0]
        lines.append(
            f"On {LABELS[metric]}, some gateway entry is supported-worse than vLLM alone in: "
            f"{join_words(regs)}."
        )
    lines.append("")
    best_gw = []
    for metric in ("anwg", "ttlt_mean"):
        better = [r for r in recs if r.metric == metric and not r.worse and r.diff.excludes_zero]
        best_gw.append(
            f"{LABELS[metric]}: {len(better)} of {len([r for r in recs if r.metric == metric])} records "
            "supported-better"
        )
    lines.append("Conversely, gateway entries supported-better than vLLM alone — " + "; ".join(best_gw) + ".")
    lines.append("")
    return lines, found
