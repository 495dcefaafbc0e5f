"""The report's preamble sections: what each metric means, and the corpus with its calibration."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sagegate.study.calibrate import Calibration
from sagegate.study.config import StudyConfig
from sagegate.study.metrics import HIGHER_IS_BETTER, LABELS, METRIC_NAMES
from sagegate.study.report.text import fmt, pct, table

if TYPE_CHECKING:
    from sagegate.study.runner import SourceInfo


def metrics_note(cfg: StudyConfig) -> list[str]:
    listed = "; ".join(
        f"`{m}` {LABELS[m]} ({'higher' if HIGHER_IS_BETTER[m] else 'lower'} is better)" for m in METRIC_NAMES
    )
    return [
        "**Metrics** (per window, then the mean over windows per condition): " + listed + ". ANWG weighs "
        f"each request by its priority; every request has priority {cfg.priority} here, so ANWG = 1 − the "
        "deadline-violation rate. Throughput = completed requests (output tokens) / (last completion − "
        "first arrival). Jain's index is taken over tenants of each tenant's share of requests finished by "
        "their deadline; it is undefined for a single-tenant source. Latencies count completed requests "
        "only and are undefined when none completed.",
        "",
    ]


def corpus_section(cfg: StudyConfig, cals: Sequence[Calibration], infos: Sequence[SourceInfo]) -> list[str]:
    by_src: dict[str, list[Calibration]] = {}
    for c in cals:
        by_src.setdefault(c.window.split("/w")[0], []).append(c)
    lines = ["## Corpus and calibration", ""]
    lines.append(
        f"Per source, {cfg.windows} windows of {cfg.window_size} contiguous valid requests (seeded, "
        f"outcome-blind, no overlap), rebased to 0. Deadline = arrival + {cfg.deadline_multiplier:g} × "
        f"({cfg.prefill_s_per_token:g} s · prompt + {cfg.decode_s_per_token:g} s · predicted output), "
        f"predicted output = true × log-normal noise of {pct(cfg.deadline_error, 0)} relative error seeded "
        f"per window; priority {cfg.priority}. λ_ref = the compression factor at which "
        f"`{cfg.calibration_policy}` at engine level (vLLM alone, one {cfg.gpu.upper()} running {cfg.model}) "
        f"reaches {pct(cfg.target_violation)} deadline violations, bisection over log10(factor) in "
        f"[{cfg.bisect_lo:g}, {cfg.bisect_hi:g}] in {cfg.bisect_steps} steps."
    )
    lines.append("")
    rows = []
    for info in infos:
        cs = by_src.get(info.name, [])
        lam = np.array([c.lambda_ref for c in cs])
        cens = Counter(c.censored for c in cs if c.censored)
        rows.append(
            [
                info.name,
                info.rows,
                info.valid,
                info.windows,
                info.tenants,
                "yes" if info.has_text else "no",
                fmt(float(np.median(lam)), 2) if len(lam) else "–",
                f"{fmt(float(np.percentile(lam, 25)), 2)}–{fmt(float(np.percentile(lam, 75)), 2)}"
                if len(lam)
                else "–",
                ", ".join(f"{k}: {v}" for k, v in sorted(cens.items())) or "0",
                fmt(float(np.median([c.arrival_rate for c in cs])), 2) if cs else "–",
                fmt(float(np.median([c.saturated_rate for c in cs])), 2) if cs else "–",
            ]
        )
    lines += table(
        [
            "source",
            "rows",
            "valid",
            "windows",
            "tenants",
            "text",
            "λ_ref median",
            "λ_ref IQR",
            "censored",
            "traced req/s",
            "saturated req/s",
        ],
        rows,
    )
    notes = [f"- `{i.name}`: {i.note}" for i in infos if i.note]
    if notes:
        lines += [*notes, ""]
    lines.append(
        "**Utilisation per region** = offered request rate (traced rate × factor) / the reference engine's "
        "saturated request rate on the window's own mix (the steady-state completion rate, between the 20th "
        "and 80th percentile completions, of five copies of the window all arriving at once). Median over "
        "windows:"
    )
    lines.append("")
    urows = []
    for info in infos:
        cs = by_src.get(info.name, [])
        urows.append(
            [info.name]
            + [
                fmt(float(np.median([c.utilisation(c.factor(cfg.region_anchor, m)) for c in cs])), 2)
                if cs
                else "–"
                for _, m in cfg.regions
            ]
        )
    unit = "λ_ref" if cfg.region_anchor == "violation" else "saturated rate"
    lines += table(["source", *[f"{r} ({m:g}× {unit})" for r, m in cfg.regions]], urows)
    return lines
