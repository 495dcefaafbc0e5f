"""Deadline-multiplier sensitivity: rankings at another multiplier compared with the base run's, and the
CLI options that run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import typer
from typer.testing import CliRunner

from sagegate.cmd_study import study
from sagegate.study.config import SourceSpec, StudyConfig, smoke_config
from sagegate.study.sensitivity import compare_runs, sensitivity_report

ENTRIES = ("fcfs@gateway", "edf@gateway", "sagesched@gateway")
CFG = StudyConfig(
    sources=(SourceSpec("s1", "x"), SourceSpec("s2", "x")),
    windows=8,
    regions=(("KNEE", 1.0), ("OVERLOAD", 1.2)),
    errors=(0.2,),
    robustness=(),
    bootstrap=400,
)


def rows(anwg: dict[tuple[str, str, str], float], seed: int) -> list[dict[str, Any]]:
    """One row per (source, region, entry, window): ``anwg`` plus small per-window noise."""
    rng = np.random.default_rng(seed)
    out = []
    for (src, region, entry), mean in anwg.items():
        policy, _, level = entry.partition("@")
        for w in range(CFG.windows):
            out.append(
                {
                    "cell": f"{src}/w{w:02d}/{region}/{entry}/noisy-oracle:0.2",
                    "source": src,
                    "window": w,
                    "region": region,
                    "utilisation": 0.9,
                    "policy": policy,
                    "level": level,
                    "entry": entry,
                    "predictor": "noisy-oracle",
                    "error": 0.2,
                    "anwg": mean + rng.normal(0, 0.01),
                    "ttlt_mean": 10.0 - 5 * mean + rng.normal(0, 0.05),
                }
            )
    return out


def base_means() -> dict[tuple[str, str, str], float]:
    levels = {"fcfs@gateway": 0.5, "edf@gateway": 0.7, "sagesched@gateway": 0.9}
    return {(s, r, e): v for s in ("s1", "s2") for r in ("KNEE", "OVERLOAD") for e, v in levels.items()}


def test_identical_runs_agree_and_a_flip_is_found() -> None:
    base = base_means()
    flipped = dict(base)
    flipped[("s1", "OVERLOAD", "fcfs@gateway")] = 0.9
    flipped[("s1", "OVERLOAD", "sagesched@gateway")] = 0.5
    runs = {20.0: (CFG, rows(base, 1)), 10.0: (CFG, rows(base, 2)), 40.0: (CFG, rows(flipped, 3))}
    ch = {(c.multiplier, c.source, c.region): c for c in compare_runs(runs, 20.0, "anwg")}
    assert len(ch) == 8  # 2 multipliers × 2 sources × 2 regions
    for key, c in ch.items():
        if key == (40.0, "s1", "OVERLOAD"):
            assert c.agreement.top1 == 0.0 and c.winner == ("fcfs@gateway",)
            assert c.agreement.tau_b < 0
            assert c.supported >= 1  # fcfs vs sagesched flips by far more than 10%
        else:
            assert c.agreement.tau_b == 1.0 and c.agreement.top1 == 1.0 and c.supported == 0
        assert c.pairs == 3
    md = sensitivity_report(runs, 20.0, "sagegate study --deadline-sensitivity 10,40")
    assert "| OVERLOAD | 1.000 | 0/2 | 0/6 | 0.000 | 1/2 |" in md
    assert "sagegate study --deadline-sensitivity 10,40" in md


def test_cli_runs_the_study_at_another_multiplier(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(study)
    src = smoke_config().sources[0].name
    args = ["--smoke", "--out", str(tmp_path), "--windows", "1", "--only-sources", src]
    args += ["--policies", "fcfs", "--errors", "0.2", "--deadline-multiplier", "40", "--workers", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["deadline_multiplier"] == 40.0 and cfg["errors"] == [0.2] and cfg["robustness"] == []
    assert [s["name"] for s in cfg["sources"]] == [src]
    assert "40 × (0.0004 s" in (tmp_path / "report.md").read_text()
    bad = CliRunner().invoke(app, ["--smoke", "--out", str(tmp_path / "b"), "--only-sources", "nope"])
    assert bad.exit_code == 2 and "unknown" in bad.output
