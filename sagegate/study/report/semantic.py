"""Does SageSched keep its lead with the semantic predictor (on the sources with prompt text)?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sagegate.study import analysis
from sagegate.study.analysis import Dataset
from sagegate.study.report.text import fmt, join_words, pct, table
from sagegate.study.sweep import SEMANTIC, VLLM_ALONE


def semantic_section(ds: Dataset, out: Path) -> tuple[list[str], dict[str, Any]]:
    lines = ["## Does SageSched keep its lead with the semantic predictor?", ""]
    found: dict[str, Any] = {}
    text_sources = [s for s in ds.sources if any((s, r, SEMANTIC) in ds.cube for r in ds.regions)]
    if not text_sources:
        why = (
            "no source of this run carries prompt text"
            if ds.cfg.semantic
            else "opt-in: `sagegate study --semantic` adds the text source `azure-conv-sharegpt` and runs it"
        )
        return [*lines, f"Not run ({why}).", ""], found
    from sagegate.study.semantic import PredictionLog, history_note, prediction_quality

    specs = {s.name: s for s in ds.cfg.sources}
    lines.append(
        "On the sources with prompt text ("
        + join_words([f"`{s}`" for s in text_sources])
        + ") every entry that reads the prediction is re-run with the `semantic` predictor (MiniLM "
        "embeddings and lexical retrieval over completed requests: the product's predictor) in place of "
        f"the noisy oracle at {pct(ds.cfg.main_error, 0)}; entries that read no prediction keep their "
        "cells, and the deadlines stay those of the workload (built from the noisy oracle, as everywhere). "
        "Each window's predictions are computed once, before the sweep, and shared by all its cells "
        "(`semantic.jsonl`, one line per window); the predictor does not learn during a window. Its "
        "history, warmed before any window is predicted: "
        + "; ".join(history_note(specs[s], ds.cfg) for s in text_sources if s in specs)
        + "."
    )
    lines.append("")
    quality = prediction_quality(PredictionLog(out / "semantic.jsonl").records())
    if quality:
        rows_q = [
            [
                src,
                int(q["requests"]),
                f"{pct(q['semantic_mare'])} / {pct(q['noisy_mare'])}",
                f"{pct(q['semantic_within2'])} / {pct(q['noisy_within2'])}",
                f"{fmt(q['semantic_rho'])} / {fmt(q['noisy_rho'])}",
            ]
            for src, q in sorted(quality.items())
        ]
        lines += table(
            [
                "source",
                "requests",
                f"median abs. error / true (semantic / noisy {pct(ds.cfg.main_error, 0)})",
                "within 2× of true",
                "Spearman rho with true",
            ],
            rows_q,
        )
        found["quality"] = quality
    ref = VLLM_ALONE.label
    rows = []
    summary = []
    for entry in [e for e in ("sagesched@gateway", "sagesched@engine") if e in ds.entries]:
        noisy = {(x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean")}
        sem = {(x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean", SEMANTIC)}
        vs_n = {(x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean", among={ref})}
        vs_s = {
            (x.source, x.region): x for x in analysis.standing(ds, entry, "ttlt_mean", SEMANTIC, among={ref})
        }
        keys = [k for k in noisy if k in sem]
        for k in keys:
            n, m = noisy[k], sem[k]
            rows.append(
                [
                    entry,
                    k[0],
                    k[1],
                    f"{n.rank}/{n.of}",
                    pct(n.lead),
                    f"{m.rank}/{m.of}",
                    pct(m.lead),
                    m.runner_up,
                    _star(vs_n.get(k)),
                    _star(vs_s.get(k)),
                ]
            )
        if not keys:
            continue
        tops_n = sum(noisy[k].top for k in keys)
        tops_s = sum(sem[k].top for k in keys)
        med_n = float(np.median([noisy[k].lead for k in keys]))
        med_s = float(np.median([sem[k].lead for k in keys]))
        kept = [sem[k].lead / noisy[k].lead for k in keys if noisy[k].lead > 0]
        found[entry] = {"tops": (tops_n, tops_s, len(keys)), "median_lead": (med_n, med_s)}
        if med_n > 0 and med_s > 0:
            verdict = f"it keeps {pct(med_s / med_n, 0)} of its median lead"
        elif med_n > 0:
            verdict = "its median lead is gone"
        elif med_s > 0:
            verdict = "it gains a lead it did not have with the noisy oracle"
        else:
            verdict = "it has no median lead with either predictor"
        summary.append(
            f"`{entry}` tops mean TTLT in {tops_n} of {len(keys)} text-source conditions with the noisy "
            f"oracle and in {tops_s} with the semantic predictor; median lead over the best other entry "
            f"{pct(med_n)} → {pct(med_s)}: {verdict}"
            + (f" (median share kept where it led: {pct(float(np.median(kept)), 0)})" if kept else "")
            + "."
        )
    if rows:
        lines.append(
            f"Rank and lead in mean TTLT among deployable entries, each condition with the noisy oracle at "
            f"{pct(ds.cfg.main_error, 0)} and with the semantic predictor (every entry there reading the "
            "same predictor); lead over vLLM alone in the last two columns (* = paired interval excludes 0)."
        )
        lines.append("")
        lines += table(
            [
                "entry",
                "source",
                "region",
                "rank (noisy)",
                "lead (noisy)",
                "rank (semantic)",
                "lead (semantic)",
                "best other (semantic)",
                "vs vLLM alone (noisy)",
                "vs vLLM alone (semantic)",
            ],
            rows,
        )
        lines += [" ".join(summary), ""]
    return lines, found


def _star(x: analysis.Standing | None) -> str:
    if x is None:
        return "–"
    return pct(x.lead) + ("*" if x.diff is not None and x.diff.excludes_zero else "")
