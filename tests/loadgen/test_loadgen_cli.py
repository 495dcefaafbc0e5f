"""``sagegate replay`` end to end against a tiny local server: flags, results files, plots, summary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from benchmarks.fakeserver import FakeServer
from sagegate.cmd_replay import parse_headers, parse_reader_opts, replay_app
from sagegate.core.request import FORCED_OUTPUT_FIELD
from sagegate.loadgen.plots import read_queue_samples
from sagegate.loadgen.results import read_results


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(interval_s=0.001).start()
    yield server
    server.stop()


@pytest.fixture
def app() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(replay_app, name="replay")
    return root


def _trace(tmp_path: Path, n: int = 30) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 40 * i, "input_length": 20 + i, "output_length": 3 + i % 4, "hash_ids": [i % 2]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_replay_writes_results_meta_and_plots(app: typer.Typer, fake: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    args = ["replay", "--url", fake.url, "--trace", str(_trace(tmp_path)), "--out", str(out), "--json"]
    args += ["--plots", str(tmp_path / "plots"), "--header", "x-tenant: team-a", "--slo-ttft-ms", "5000"]
    args += ["--warmup", "0.2", "--metrics-interval", "0.05", "--no-progress", "--rate-scale", "2"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    records = read_results(out)
    assert len(records) == 30 and sum(r.warmup for r in records) == 10  # arrivals 0, 0.02, ... < 0.2
    assert data["summary"]["requests"] == 20 and data["summary"]["completed"] == 20
    assert data["summary"]["slo_attainment"] == 1.0 and data["errors_by_kind"] == {}
    assert [r.output_tokens for r in records] == [3 + i % 4 for i in range(30)]
    assert read_queue_samples(out)
    assert {Path(p).name for p in data["plots"]} >= {
        "latency_cdf.png",
        "timeline_run.png",
        "predicted_run.png",
    }
    posts = [x for x in fake.received if x.path == "/v1/completions" and x.body["prompt"] != "warm up"]
    assert len(posts) == 30 and all(x.headers["x-tenant"] == "team-a" for x in posts)
    even = {x.body["prompt"][: 4 * 20] for x in posts if x.body[FORCED_OUTPUT_FIELD] == 3}  # hash id 0
    odd = {x.body["prompt"][: 4 * 20] for x in posts if x.body[FORCED_OUTPUT_FIELD] == 4}  # hash id 1
    assert len(even) == 1 and len(odd) == 1 and even != odd  # equal hash ids: identical prompt starts


def test_replay_table_output(app: typer.Typer, fake: FakeServer, tmp_path: Path) -> None:
    args = [
        "replay",
        "--url",
        fake.url,
        "--trace",
        "synthetic",
        "--limit",
        "10",
        "--rate",
        "50",
        "--no-progress",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "TTFT (ms)" in res.output and "ITL (ms)" in res.output and "completed" in res.output


def test_replay_usage_errors(app: typer.Typer, tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["replay", "--trace", "synthetic"]).exit_code == 2
    res = runner.invoke(app, ["replay", "--url", "http://x", "--trace", str(tmp_path / "absent.jsonl")])
    assert res.exit_code == 2
    with pytest.raises(ValueError, match="name: value"):
        parse_headers(["no-colon"])
    assert parse_headers(["X-Tenant:  a b "]) == {"x-tenant": "a b"}
    assert parse_reader_opts(["start_s=3600", "clients=[1, 2]", "name=abc"]) == {
        "start_s": 3600,
        "clients": [1, 2],
        "name": "abc",
    }
    with pytest.raises(ValueError, match="name=value"):
        parse_reader_opts(["=3"])


def test_replay_exits_non_zero_when_every_request_fails(
    tmp_path: Path, fake: FakeServer, app: typer.Typer
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"arrival_s": 0.01 * i, "prompt_tokens": 3, "output_tokens": 2, "prompt": "[fail] x"}
        for i in range(5)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["replay", "--url", fake.url, "--trace", str(trace), "--no-progress", "--queue-metric", ""]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 1, res.output
    assert "none of the 5 requests completed" in res.output
    assert json.loads(res.output.splitlines()[0])["summary"]["preemptions"] is None  # unknown, not 0
