"""The study's report: Markdown with tables and PNG figures, every sentence generated from the data.

Nothing here states a conclusion in advance: each answer is a template filled from computed figures,
and each verdict against LSSP applies a rule written next to it in the report. Each section is its own
module of this package; :func:`write_report` puts them in order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagegate.study import analysis
from sagegate.study.calibrate import Calibration
from sagegate.study.config import StudyConfig
from sagegate.study.report.agreement import cross_metric_section, cross_source_section
from sagegate.study.report.corpus import corpus_section, metrics_note
from sagegate.study.report.exclusions import exclusions_section
from sagegate.study.report.gateway_vs_vllm import gateway_section
from sagegate.study.report.lssp import lssp_section
from sagegate.study.report.rankings import rankings_section, sample_complexity_section
from sagegate.study.report.reversals import reversals_section
from sagegate.study.report.robustness import robustness_section
from sagegate.study.report.sagesched import sagesched_section
from sagegate.study.report.semantic import semantic_section
from sagegate.study.report.text import fmt
from sagegate.study.sweep import predictor_label

if TYPE_CHECKING:
    from sagegate.study.runner import SourceInfo

__all__ = ["write_report"]


def write_report(
    out: Path,
    cfg: StudyConfig,
    rows: Sequence[Mapping[str, Any]],
    cals: Sequence[Calibration],
    infos: Sequence[SourceInfo],
    timing: Mapping[str, float],
) -> Path:
    """Write ``out/report.md`` and ``out/figures/*.png``; returns the report's path."""
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    ds = analysis.load(rows, cfg)
    preds = sorted({predictor_label(str(r["predictor"]), float(r["error"])) for r in rows})
    lines = ["# The portability study: results", ""]
    lines.append(
        f"{len(ds.sources)} sources × {cfg.windows} windows × {len(ds.regions)} regions × {len(ds.entries)} "
        f"panel entries (policy@level) on one {cfg.gpu.upper()} running {cfg.model}; predictor settings "
        f"{', '.join(preds)}; {len(rows)} cells. Simulation wall time (corpus, calibration and sweep): "
        f"{fmt(timing.get('simulate_total_s', math.nan), 0)} s, of which the workers spent "
        f"{fmt(timing.get('calibration_cpu_s', math.nan) + timing.get('sweep_cpu_s', math.nan), 0)} "
        "CPU-seconds simulating (this run's part; a resumed run counts only what it ran). The results file "
        "is `cells.csv` (one row per cell), the configuration and seeds `config.json`; `sagegate study "
        "--out DIR` reruns it (resumable)."
    )
    lines.append("")
    lines += metrics_note(cfg)
    lines += corpus_section(cfg, cals, infos)
    lines += ["## Rankings", ""]
    for metric in ("anwg", "ttlt_mean"):
        part, _ = rankings_section(ds, figdir, metric)
        lines += part
    part_cs, cs = cross_source_section(ds, figdir)
    lines += part_cs
    part_rev, rev = reversals_section(ds, figdir)
    lines += part_rev
    part_cm, cm = cross_metric_section(ds, figdir)
    lines += part_cm
    lines += sample_complexity_section(ds)
    part, _ = sagesched_section(ds)
    lines += part
    part, _ = robustness_section(ds, figdir)
    lines += part
    part, _ = semantic_section(ds, out)
    lines += part
    part, _ = gateway_section(ds)
    lines += part
    lines += lssp_section(ds, cs, rev, cm)
    lines += exclusions_section(ds)
    lines += ["## Configuration and seeds", "", "```json", json.dumps(cfg.to_dict(), indent=1), "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
