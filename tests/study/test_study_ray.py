"""The Ray executor writes the same results file as the local one on the smoke study."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sagegate.cmd_study import study

pytestmark = pytest.mark.heavy  # a local Ray cluster

app = typer.Typer()
app.command()(study)


def test_ray_matches_local(tmp_path: Path) -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray is not installed (pip install ray) — the Ray executor cannot be checked")
    local, remote = tmp_path / "local", tmp_path / "ray"
    res = CliRunner().invoke(app, ["--smoke", "--out", str(local), "--workers", "2"])
    assert res.exit_code == 0, res.output
    # --workers 2 starts a local Ray with num_cpus=2
    res = CliRunner().invoke(app, ["--smoke", "--out", str(remote), "--executor", "ray", "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert (remote / "cells.csv").read_bytes() == (local / "cells.csv").read_bytes()
    assert (remote / "calibration.jsonl").exists()
