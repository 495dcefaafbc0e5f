"""The main job, in its reduced form: both runs complete and the table shows them side by side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _left_in_group(pgid: int) -> list[str]:
    """Processes still in the demo's own process group (its backends and gateway inherit it)."""
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.slow
def test_demo_quick_shows_both_runs_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sagegate.cli", "demo", "--quick", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so what it leaves behind can be found
    )
    stdout, stderr = proc.communicate(timeout=600)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "A: vLLM alone" in out.stdout and "B: gateway sagesched" in out.stdout
    completed = [line for line in out.stdout.splitlines() if "completed" in line]
    assert completed, out.stdout
    cells = [c.strip() for c in completed[0].split("│") if c.strip()]
    assert cells[1] == cells[2] and int(cells[1]) > 0  # every request completed in both runs
    assert (tmp_path / "vLLM_alone.jsonl").exists() and (tmp_path / "gateway_sagesched.jsonl").exists()
    assert (tmp_path / "plots" / "latency_cdf.png").exists()
    assert (tmp_path / "plots" / "backends_gateway_sagesched.png").exists()
    assert "vLLM alone's capacity" in out.stdout and "live ÷ simulated" in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["utilisation"] > 0 and summary["live_ratios"]["ttlt_mean_s"] > 0
    assert _left_in_group(proc.pid) == []  # every backend and gateway the demo started is gone
