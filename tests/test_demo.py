"""The main job, in its reduced form: both runs complete and the table shows them side by side."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _children() -> set[str]:
    found = subprocess.run(
        ["pgrep", "-f", "sagegate.cmd_backend|sagegate.cli serve"], capture_output=True, text=True
    )
    return set(found.stdout.split())


@pytest.mark.slow
def test_demo_quick_shows_both_runs_and_leaves_no_process(tmp_path):
    before = _children()
    out = subprocess.run(
        [sys.executable, "-m", "sagegate.cli", "demo", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "A: vLLM alone" in out.stdout and "B: gateway sagesched" in out.stdout
    completed = [line for line in out.stdout.splitlines() if "completed" in line]
    assert completed, out.stdout
    cells = [c.strip() for c in completed[0].split("│") if c.strip()]
    assert cells[1] == cells[2] and int(cells[1]) > 0  # every request completed in both runs
    assert (tmp_path / "vLLM_alone.jsonl").exists() and (tmp_path / "gateway_sagesched.jsonl").exists()
    assert (tmp_path / "plots" / "latency_cdf.png").exists()
    assert _children() <= before  # every backend and gateway the demo started is gone
