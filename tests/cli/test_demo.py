"""The main job, in its reduced form: three set-ups over two draws side by side, nothing left running."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.gateway_support import wait_until

pytestmark = pytest.mark.heavy  # the demo and its backends, as processes


def _left_in_group(pgid: int) -> list[str]:
    """Processes still in the demo's own process group (its backends and gateway inherit it)."""
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.slow
def test_demo_quick_runs_three_setups_over_two_draws_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sagegate.cli", "demo", "--quick", "--no-progress", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so what it leaves behind can be found
    )
    stdout, stderr = proc.communicate(timeout=900)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cache-aware baseline: vllm-router" in out.stdout  # the real router, installed with the demo
    for draw in (0, 1):
        for name in ("round_robin", "cache-aware_router", "gateway"):
            assert (tmp_path / f"draw{draw}_{name}.jsonl").exists()
    assert "÷ round robin" in out.stdout and "÷ cache-aware router" in out.stdout
    assert "tok/s, loaded window" in out.stdout and "tok/s, makespan" in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [d["draw"] for d in summary["draws"]] == [0, 1]
    assert all(d["utilisation"] > 0 for d in summary["draws"])
    for name, runs in summary["live"].items():  # every request completed in every set-up and draw
        assert [r["completed"] for r in runs] == [d["requests"] for d in summary["draws"]], name
        assert all(r["errors"] == 0 for r in runs)
    ratio = summary["headline"]["ratios"]["cache-aware router"]["ttlt_mean_s"]
    assert ratio["low"] <= ratio["mean"] <= ratio["high"] and ratio["mean"] > 0
    assert summary["live"]["gateway"][0]["prefix_hit_rate"] >= 0
    plots = ("latency_cdf.png", "hit_rate.png", "backends_gateway.png", "backends_cache_aware_router.png")
    for plot in plots:
        assert (tmp_path / "plots" / plot).exists(), plot
    assert "live ÷ simulated" in out.stdout
    assert _left_in_group(proc.pid) == []  # every backend, router and gateway the demo started is gone


def test_demo_twin_only_runs_no_process_and_tabulates_every_draw(tmp_path):
    args = ["demo", "--no-live", "--quick", "--draws", "3", "--seed", "2", "--no-progress"]
    out = subprocess.run(
        [sys.executable, "-m", "sagegate.cli", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Simulated:" in out.stdout and "3 draws" in out.stdout and "÷ round robin" in out.stdout
    assert "vllm-router" not in out.stdout  # nothing live is started
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["live"] == {}
    assert [d["draw"] for d in summary["draws"]] == [2, 3, 4]
    for runs in summary["simulated"].values():  # the twin serves every request of every draw
        assert [r["completed"] for r in runs] == [d["requests"] for d in summary["draws"]]
    ratio = summary["headline"]["ratios"]["round robin"]["ttlt_mean_s"]
    assert ratio["low"] <= ratio["mean"] <= ratio["high"]
    assert not list(tmp_path.glob("draw*.jsonl"))  # no live records


def test_a_demo_killed_mid_run_leaves_no_process(tmp_path):
    """``kill`` (SIGTERM) unwinds the demo as Ctrl-C would: the backends it started go with it."""
    import signal

    args = ["demo", "--quick", "--no-router", "--no-progress", "--out", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sagegate.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(  # it and two backends
            lambda: len(_left_in_group(proc.pid)) >= 3, timeout=120, what="the demo's backends started"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        wait_until(lambda: _left_in_group(proc.pid) == [], timeout=30, what="no process of the demo left")
    finally:
        if proc.poll() is None:
            proc.kill()
