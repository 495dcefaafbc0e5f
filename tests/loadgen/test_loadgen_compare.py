"""Result files and their comparison: summary extensions (ITL, goodput, errors by kind), JSONL and
Parquet round trips, ``compare`` ratios on handmade files and on a real ``sagegate simulate`` output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sagegate.cmd_replay import replay_app
from sagegate.core.record import RequestRecord
from sagegate.core.summary import Slo, errors_by_kind, summarize
from sagegate.loadgen.compare import Row, compare_files, compare_records
from sagegate.loadgen.results import read_results, write_results


def _run(scale: float, n: int = 10, errors: int = 0) -> list[RequestRecord]:
    """``n`` completed requests whose latencies are ``scale`` × a fixed pattern, plus failed ones."""
    out = []
    for i in range(n):
        ttft = scale * 0.1 * (i + 1)
        chunks = [i + ttft + scale * 0.02 * k for k in range(5)]
        out.append(
            RequestRecord(
                rid=i,
                arrival_s=float(i),
                prompt_tokens=100,
                output_tokens=5,
                first_token_s=chunks[0],
                finish_s=chunks[-1],
                chunk_times=chunks,
                sent_s=float(i) + 0.001,
            )
        )
    for j in range(errors):
        out.append(
            RequestRecord(
                rid=n + j,
                arrival_s=float(j),
                prompt_tokens=1,
                output_tokens=0,
                status="error",
                error_kind="timeout",
            )
        )
    return out


def _by_metric(rows: list[Row]) -> dict[str, Row]:
    return {r.metric: r for r in rows}


def test_summary_has_itl_goodput_lateness_and_error_kinds() -> None:
    recs = _run(1.0, errors=2)
    recs.append(
        RequestRecord(
            rid=99, arrival_s=0, prompt_tokens=1, output_tokens=0, status="rejected", reason="queue_full"
        )
    )
    s = summarize(recs, Slo(ttft_s=0.55))
    assert s["itl_p50_s"] == pytest.approx(0.02)
    assert s["tpot_mean_s"] == pytest.approx(0.02)
    assert s["slo_attainment"] == pytest.approx(5 / 13)  # ttft 0.1..0.5 meet it, of 13 requests
    span = s["makespan_s"]
    assert s["goodput_req_s"] == pytest.approx(5 / span)
    assert s["send_lateness_p50_s"] == pytest.approx(0.001)
    assert errors_by_kind(recs) == {"timeout": 2, "queue_full": 1}
    assert "goodput_req_s" not in summarize(recs)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_results_round_trip(tmp_path: Path, suffix: str) -> None:
    recs = _run(1.0, n=4, errors=1)
    recs[0].predicted_mean = 12.5
    recs[1].warmup = True
    path = write_results(recs, tmp_path / f"r{suffix}")
    assert read_results(path) == recs


def test_compare_ratios_on_handmade_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    write_results(_run(1.0, errors=1), a)
    write_results(_run(2.0, errors=2), b)
    rows = _by_metric(compare_files(a, b))
    for key in ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p90_s"):
        assert rows[key].ratio == pytest.approx(2.0), key
    assert rows["completed"].ratio == 1.0
    assert rows["errors[timeout]"].ratio == 2.0
    sa, sb = summarize(_run(1.0, errors=1)), summarize(_run(2.0, errors=2))
    assert rows["throughput_tok_s"].ratio == pytest.approx(sb["throughput_tok_s"] / sa["throughput_tok_s"])


def test_compare_cli_json_and_table(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_results(_run(1.0), a)
    write_results(_run(3.0), b)
    app = typer.Typer()
    app.add_typer(replay_app, name="replay")
    runner = CliRunner()
    res = runner.invoke(app, ["replay", "compare", str(a), str(b), "--json", "--slo-ttft-ms", "500"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["metrics"]["ttft_p50_s"]["ratio"] == pytest.approx(3.0)
    assert data["metrics"]["slo_attainment"]["a"] == pytest.approx(0.5)
    assert data["metrics"]["queue_p50_s"] == {"a": None, "b": None, "ratio": None}  # NaN as null
    table = runner.invoke(app, ["replay", "compare", str(a), str(b)])
    assert table.exit_code == 0 and "3.000" in table.output and "ttft_p50_s" in table.output


def test_compare_live_format_against_sagegate_simulate(tmp_path: Path) -> None:
    from sagegate.cli import app as main_app

    sim = tmp_path / "sim.jsonl"
    res = CliRunner().invoke(
        main_app, ["simulate", "--requests", "60", "--rate", "5", "--out", str(sim), "--json"]
    )
    assert res.exit_code == 0, res.output
    live = tmp_path / "live.jsonl"
    recs = read_results(sim)
    for r in recs:  # a live-looking copy: the same requests, twice as slow, with chunk times
        if r.first_token_s is not None and r.finish_s is not None:
            r.first_token_s = r.arrival_s + 2 * (r.first_token_s - r.arrival_s)
            r.finish_s = r.arrival_s + 2 * (r.finish_s - r.arrival_s)
            r.chunk_times = [r.first_token_s, r.finish_s]
    write_results(recs, live)
    rows = _by_metric(compare_files(sim, live))
    assert rows["ttlt_p50_s"].ratio == pytest.approx(2.0)
    assert rows["itl_p50_s"].a is None and rows["itl_p50_s"].ratio is None


def test_compare_records_skips_rows_neither_run_has() -> None:
    rows = compare_records(_run(1.0), _run(1.0))
    names = [r.metric for r in rows]
    assert "slo_attainment" not in names and "deadline_violation_rate" not in names
    numeric = [r for r in rows if r.a is not None and not math.isnan(r.a) and r.a != 0]
    assert numeric and all(r.ratio == pytest.approx(1.0) for r in numeric)
    assert all(r.ratio is None for r in rows if r not in numeric)
