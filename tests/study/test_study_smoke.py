"""``sagegate study --smoke``: the whole study on a small grid writes its report, and resumes.

Uses the Azure 2023 traces when the shared data is present, synthetic sources otherwise, so it runs
in a fresh checkout too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sagegate.cmd_study import study
from sagegate.study.config import smoke_config

pytestmark = pytest.mark.heavy  # the smoke study on a pool of worker processes

app = typer.Typer()
app.command()(study)


def smoke_cells() -> int:
    """Cells the smoke spec implies, counted from the spec itself."""
    from sagegate.policies.registry import registry

    cfg = smoke_config()
    reg = registry()
    entries = [
        (p, lvl) for p in cfg.policies or () for lvl in ("gateway", "engine") if lvl in reg[p].cls.levels
    ]
    entries.remove(("fcfs", "engine"))  # the same run as vllm-v1@engine
    rerun = [(p, lvl) for p, lvl in entries if f"{p}@{lvl}" in cfg.robustness]
    per = len(entries) + len(rerun) * (len(cfg.errors) - 1)
    return len(cfg.sources) * cfg.windows * len(cfg.regions) * per


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    res = CliRunner().invoke(app, ["--smoke", "--out", str(out), "--workers", "2"])
    assert res.exit_code == 0, res.output
    return out


def test_smoke_writes_report_figures_and_results(smoke_dir: Path) -> None:
    report = (smoke_dir / "report.md").read_text()
    assert "| region | source A | source B | tau-b |" in report
    for section in ("## Corpus and calibration", "## Reversals between sources", "## Beside LSSP"):
        assert section in report
    pngs = sorted((smoke_dir / "figures").glob("*.png"))
    assert {p.stem for p in pngs} >= {"tau_anwg", "ranking_anwg", "reversals_anwg", "metric_disagreement"}
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"figures/{p.name}" in report
    with (smoke_dir / "cells.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == smoke_cells()
    assert len({r["cell"] for r in rows}) == len(rows)
    assert [r["cell"] for r in rows] == sorted(r["cell"] for r in rows)
    anwg = [float(r["anwg"]) for r in rows]
    assert all(0.0 <= a <= 1.0 for a in anwg)
    cfg = json.loads((smoke_dir / "config.json").read_text())
    assert cfg["seed"] == smoke_config().seed and cfg["windows"] == 3


def test_regions_scale_with_each_windows_knee(smoke_dir: Path) -> None:
    cals = {}
    for line in (smoke_dir / "calibration.jsonl").read_text().splitlines():
        c = json.loads(line)
        cals[c["window"]] = c["lambda_ref"]
    mult = dict(smoke_config().regions)
    with (smoke_dir / "cells.csv").open() as fh:
        for r in csv.DictReader(fh):
            wid = f"{r['source']}/w{int(r['window']):02d}"
            assert float(r["factor"]) == pytest.approx(mult[r["region"]] * cals[wid])


def test_rerun_resumes_without_simulating(smoke_dir: Path) -> None:
    before = (smoke_dir / "cells.csv").read_bytes()
    res = CliRunner().invoke(app, ["--smoke", "--out", str(smoke_dir), "--workers", "1"])
    assert res.exit_code == 0, res.output
    timing = json.loads(res.output.strip().splitlines()[-1])
    assert timing["cells_run"] == 0
    assert (smoke_dir / "cells.csv").read_bytes() == before


def test_resume_refuses_another_configuration(smoke_dir: Path) -> None:
    res = CliRunner().invoke(app, ["--smoke", "--out", str(smoke_dir), "--seed", "99"])
    assert res.exit_code == 2
    assert "another configuration" in res.output


def test_report_only_rebuilds_the_report(smoke_dir: Path) -> None:
    before = (smoke_dir / "report.md").read_text()
    (smoke_dir / "report.md").unlink()
    res = CliRunner().invoke(app, ["--out", str(smoke_dir), "--report-only"])
    assert res.exit_code == 0, res.output
    after = (smoke_dir / "report.md").read_text()
    assert after == before
