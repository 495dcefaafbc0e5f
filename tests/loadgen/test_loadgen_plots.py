"""Plots: PNG files for latency CDFs (runs overlaid), TTFT and queue depth over time, predictions."""

from __future__ import annotations

import json
from pathlib import Path

from sagegate.core.record import RequestRecord
from sagegate.loadgen.plots import (
    latency_values,
    plot_latency_cdfs,
    plot_predicted_vs_actual,
    plot_runs,
    plot_timeline,
    read_queue_samples,
)
from sagegate.loadgen.results import write_results

PNG = b"\x89PNG\r\n\x1a\n"


def _records(scale: float, predicted: bool = False) -> list[RequestRecord]:
    out = []
    for i in range(30):
        first = i * 0.5 + scale * 0.05 * (1 + i % 4)
        chunks = [first + scale * 0.01 * k for k in range(1 + i % 7)]
        out.append(
            RequestRecord(
                rid=i,
                arrival_s=i * 0.5,
                prompt_tokens=50,
                output_tokens=len(chunks),
                first_token_s=chunks[0],
                finish_s=chunks[-1],
                chunk_times=chunks,
                predicted_mean=len(chunks) * 1.3 if predicted else None,
                warmup=i < 2,
            )
        )
    out.append(RequestRecord(rid=99, arrival_s=3.0, prompt_tokens=1, output_tokens=0, status="error"))
    return out


def _is_png(p: Path) -> bool:
    return p.is_file() and p.read_bytes()[:8] == PNG and p.stat().st_size > 2000


def test_latency_values_leave_out_warmup_and_failures() -> None:
    v = latency_values(_records(1.0))
    assert len(v["TTFT"]) == 28 and len(v["TTLT"]) == 28
    assert len(v["ITL"]) == sum(i % 7 for i in range(2, 30))


def test_each_plot_writes_a_png(tmp_path: Path) -> None:
    runs = {"vllm": _records(1.0), "gateway": _records(0.5, predicted=True)}
    assert _is_png(plot_latency_cdfs(runs, tmp_path / "cdf.png"))
    queue = [(t * 0.25, float(t % 5)) for t in range(60)]
    assert _is_png(plot_timeline(runs["vllm"], tmp_path / "timeline.png", queue, title="vllm"))
    assert _is_png(plot_timeline(runs["vllm"], tmp_path / "timeline_noq.png"))
    assert _is_png(plot_predicted_vs_actual(runs["gateway"], tmp_path / "pred.png") or Path("missing"))
    assert plot_predicted_vs_actual(runs["vllm"], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_plot_runs_reads_queue_samples_from_the_sidecar(tmp_path: Path) -> None:
    results = tmp_path / "run.jsonl"
    write_results(_records(1.0, predicted=True), results)
    Path(str(results) + ".meta.json").write_text(json.dumps({"queue_samples": [[0.0, 1], [1.0, 3]]}))
    assert read_queue_samples(results) == [(0.0, 1.0), (1.0, 3.0)]
    assert read_queue_samples(tmp_path / "absent.jsonl") == []
    paths = plot_runs(
        {"run": _records(1.0, predicted=True)}, tmp_path / "plots", {"run": read_queue_samples(results)}
    )
    assert sorted(p.name for p in paths) == ["latency_cdf.png", "predicted_run.png", "timeline_run.png"]
    assert all(_is_png(p) for p in paths)
