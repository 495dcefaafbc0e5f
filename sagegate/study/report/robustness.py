"""How much of SageSched's lead survives a rising prediction error."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.study import analysis, figures
from sagegate.study.analysis import Dataset
from sagegate.study.report.text import join_words, pct, table
from sagegate.study.sweep import NOISY, VLLM_ALONE, predictor_label


def robustness_section(ds: Dataset, figdir: Path) -> tuple[list[str], dict[str, Any]]:
    lines = ["## How much of SageSched's lead survives prediction error?", ""]
    entries = [e for e in ("sagesched@gateway", "sagesched@engine") if e in ds.entries]
    errs = list(ds.cfg.errors)
    found: dict[str, Any] = {}
    if not entries or len(errs) < 2:
        return [*lines, "Not run (needs `sagesched` and more than one prediction error).", ""], found
    comp = analysis.robustness_comparators(ds, entries)
    lines.append(
        f"The noisy oracle's error is raised to {join_words([pct(e, 0) for e in errs[1:]])} for the entries "
        f"{join_words([f'`{p}`' for p in ds.cfg.robustness if p in ds.entries])} "
        "(every gateway entry depends on "
        "it: the admission charge reads the prediction). SageSched is compared, at each error, against the "
        f"entries available at every error ({len(comp)}: {join_words(sorted(comp))}) "
        "— the re-run ones at the "
        "same error, and those that do not read predictions. Lead = relative margin in mean TTLT over the "
        "best of them (positive: ahead)."
    )
    lines.append("")
    leads: dict[str, dict[float, float]] = {}
    vs_leads: dict[str, dict[float, float]] = {}
    rows = []
    for entry in entries:
        base = {(s.source, s.region): s for s in analysis.standing(ds, entry, "ttlt_mean", among=comp)}
        leads[entry] = {}
        for err in errs:
            pred = predictor_label(NOISY, err)
            st = analysis.standing(ds, entry, "ttlt_mean", pred, among=comp)
            ls = [s.lead for s in st if math.isfinite(s.lead)]
            med = float(np.median(ls)) if ls else math.nan
            leads[entry][err] = med
            kept = [
                s.lead / base[(s.source, s.region)].lead
                for s in st
                if (s.source, s.region) in base
                and base[(s.source, s.region)].lead > 0
                and math.isfinite(s.lead)
            ]
            tops = sum(s.top for s in st)
            vs = analysis.standing(ds, entry, "ttlt_mean", pred, among={VLLM_ALONE.label})
            vs_med = float(np.median([x.lead for x in vs])) if vs else math.nan
            vs_ahead = sum(1 for x in vs if x.lead > 0 and x.diff is not None and x.diff.excludes_zero)
            vs_leads.setdefault(entry, {})[err] = vs_med
            rows.append(
                [
                    entry,
                    pct(err, 0),
                    len(st),
                    tops,
                    pct(med),
                    pct(float(np.median(kept))) if kept else "–",
                    len(kept),
                    pct(vs_med),
                    f"{vs_ahead}/{len(vs)}",
                ]
            )
    lines += table(
        [
            "entry",
            "error",
            "conditions",
            "top",
            "median lead",
            "median share of the 20% lead kept",
            "conditions with a 20% lead",
            "median lead over vLLM alone",
            "supported-faster than vLLM alone",
        ],
        rows,
    )
    series = {f"{e} vs best comparator": v for e, v in leads.items()}
    series.update({f"{e} vs vLLM alone": v for e, v in vs_leads.items()})
    path = figures.robustness_lines(
        series, "SageSched's lead in mean TTLT vs prediction error", figdir / "robustness.png"
    )
    lines += [f"![robustness]({path.parent.name}/{path.name})", ""]
    for entry in entries:
        e0, e_last = errs[0], errs[-1]
        l0, l_last = leads[entry][e0], leads[entry][e_last]
        if not math.isfinite(l0) or not math.isfinite(l_last):
            verdict = ""
        elif l0 <= 0:
            verdict = (
                f" At {pct(e0, 0)} error it has no lead to lose: in the median condition it trails the best "
                f"comparator by {pct(-l0)}."
            )
        elif l_last > 0:
            verdict = f" {pct(l_last / l0, 0)} of its median lead survives {pct(e_last, 0)} error."
        else:
            verdict = f" Its lead is gone at {pct(e_last, 0)} error."
        v0, v_last = vs_leads[entry][e0], vs_leads[entry][e_last]
        against_vllm = ""
        if math.isfinite(v0) and math.isfinite(v_last):
            against_vllm = (
                f" Against vLLM alone its median margin goes from {pct(v0)} at {pct(e0, 0)} error to "
                f"{pct(v_last)} at {pct(e_last, 0)}"
                + (f" ({pct(v_last / v0, 0)} of it kept)." if v0 > 0 and v_last > 0 else ".")
            )
        lines.append(
            f"`{entry}`: median lead {pct(l0)} at {pct(e0, 0)} error, "
            + ", ".join(f"{pct(leads[entry][e])} at {pct(e, 0)}" for e in errs[1:])
            + "."
            + verdict
            + against_vllm
        )
    lines.append("")
    found["leads"] = leads
    return lines, found
