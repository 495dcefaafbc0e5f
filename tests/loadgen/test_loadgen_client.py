"""The open-loop replay client: on-schedule sends, per-request timing and counts, failure kinds,
against a tiny in-process server and against the simulated backend."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.fakeserver import FakeServer
from sagegate.core.request import FORCED_OUTPUT_FIELD, TraceRequest
from sagegate.core.summary import errors_by_kind, summarize
from sagegate.harness.procs import free_port
from sagegate.loadgen.client import ReplayConfig, replay
from sagegate.loadgen.prompts import filler_text
from sagegate.loadgen.records import with_client_cap
from sagegate.loadgen.schedule import prepare_workload

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(interval_s=0.002).start()
    yield server
    server.stop()


@pytest.fixture
def stalling() -> Iterator[FakeServer]:
    server = FakeServer(stall=True).start()
    yield server
    server.stop()


def _requests(n: int, gap_s: float, output: int = 8, prompt: str | None = None) -> list[TraceRequest]:
    return [
        TraceRequest(i * gap_s, 12, output, rid=i, prompt=prompt or filler_text(12, seed=i)) for i in range(n)
    ]


def test_open_loop_sends_leave_on_schedule_against_a_stalling_backend(stalling: FakeServer) -> None:
    work = prepare_workload("synthetic", limit=60, rate=60.0, seed=2, prompts="filler")
    # 2 s before the client gives up: long enough that a send a loaded machine slows still reaches
    # the server (with 0.4 s one of 60 did not, once, on a fresh clone)
    cfg = ReplayConfig(url=stalling.url, model="m", timeout_s=2.0, queue_metric=None, prime=False)
    result = replay(work.requests, cfg)
    late_ms = [1000 * (r.lateness or 0.0) for r in result.records]
    # the server's receipt of each request, on the same monotonic clock, against its schedule
    posts = sorted(x.t for x in stalling.received if x.path == "/v1/completions")
    arrive_ms = [1000 * (t - result.t0 - r.arrival_s) for t, r in zip(posts, result.records, strict=True)]
    print(
        f"\nsend lateness ms: median {statistics.median(late_ms):.2f}, max {max(late_ms):.2f}; "
        f"server receipt lateness ms: median {statistics.median(arrive_ms):.2f}, max {max(arrive_ms):.2f}"
    )
    assert len(posts) == 60  # every request reached the server although none was ever answered
    assert all(r.error_kind == "timeout" for r in result.records)
    assert result.delayed_sends == 0
    # No send waited behind a stalled response (that would be late by the 2 s stall). The bound is
    # that behaviour, not a timing figure: how late sends leave is measured by bench_loadgen.py.
    assert statistics.median(late_ms) < 500.0


def test_the_connection_limit_delays_and_reports_sends(stalling: FakeServer) -> None:
    cfg = ReplayConfig(
        url=stalling.url, model="m", timeout_s=0.3, queue_metric=None, max_connections=3, prime=False
    )
    result = replay(_requests(10, 0.01), cfg)
    assert result.delayed_sends == 7
    assert result.max_send_delay_s >= 0.2
    held = sorted(r.lateness or 0.0 for r in result.records)
    assert max(held[:3]) < 0.2 <= min(held[3:])  # three leave at once, seven wait for a timeout


def test_streams_are_timed_and_counted(fake: FakeServer) -> None:
    reqs = _requests(12, 0.01, output=20)
    reqs += [
        TraceRequest(0.2, 3, 6, rid=12, prompt="[nousage] a b", tenant="acme", priority=0, deadline_s=2.2)
    ]
    cfg = ReplayConfig(
        url=fake.url + "/v1", api_key="sk-test", headers={"x-run": "t1"}, metrics_interval_s=0.02, prime=False
    )
    result = replay(reqs, cfg)
    assert result.model == "fake"
    for r, q in zip(result.records, reqs, strict=True):
        assert r.status == "ok", (r.error_kind, r.reason)
        assert r.output_tokens == len(r.chunk_times) == q.output_tokens
        assert r.chunk_times == sorted(r.chunk_times)
        assert r.arrival_s <= (r.sent_s or 0) <= (r.first_byte_s or 0) <= (r.first_token_s or 0)
        assert r.finish_s == r.chunk_times[-1] and r.http_status == 200
        assert r.predicted_mean == 2 * q.output_tokens
    assert [r.prompt_tokens for r in result.records[:12]] == [12] * 12  # from usage
    sent = [x for x in fake.received if x.path == "/v1/completions"]
    asked = {q.prompt or "": q.output_tokens for q in reqs}
    assert sorted(x.body["prompt"] for x in sent) == sorted(asked)
    # the true length travels only in the forcing field; no cap was configured, so none is sent
    assert all(x.body[FORCED_OUTPUT_FIELD] == asked[x.body["prompt"]] for x in sent)
    assert not any("max_tokens" in x.body or "ignore_eos" in x.body for x in sent)
    assert all(x.headers["content-type"] == "application/json" for x in sent)
    assert result.forced_mismatch == 0 and "forced" in result.outputs_note()
    assert all(
        x.body["stream_options"] == {"include_usage": True} and x.body["model"] == "fake" for x in sent
    )
    assert all(x.headers["authorization"] == "Bearer sk-test" and x.headers["x-run"] == "t1" for x in sent)
    tagged = next(x for x in sent if x.body["prompt"].startswith("[nousage]"))
    assert tagged.headers["x-tenant"] == "acme" and tagged.headers["x-priority"] == "0"
    assert tagged.headers["x-deadline-ms"] == "2000"
    assert result.queue_samples and max(v for _, v in result.queue_samples) >= 1
    summary = summarize(result.records)
    assert summary["completed"] == 13 and summary["itl_p50_s"] >= 0


def test_chat_api_skips_the_role_chunk(fake: FakeServer) -> None:
    result = replay(
        _requests(3, 0.01, output=5), ReplayConfig(url=fake.url, api="chat", queue_metric=None, prime=False)
    )
    assert all(r.status == "ok" and len(r.chunk_times) == 5 == r.output_tokens for r in result.records)
    sent = [x for x in fake.received if x.path == "/v1/chat/completions"]
    assert sent[0].body["messages"][0]["role"] == "user"


def test_failures_are_classified(fake: FakeServer) -> None:
    reqs = [
        TraceRequest(0.0, 2, 4, rid=0, prompt="[reject] x"),
        TraceRequest(0.0, 2, 4, rid=1, prompt="[fail] x"),
        TraceRequest(0.0, 2, 8, rid=2, prompt="[cut] x"),
        TraceRequest(0.0, 2, 4, rid=3, prompt="fine"),
    ]
    records = replay(reqs, ReplayConfig(url=fake.url, queue_metric=None)).records
    primed = [x for x in fake.received if x.path == "/v1/completions" and x.body["prompt"] == "warm up"]
    assert len(primed) == 1 and primed[0].body["max_tokens"] == 1  # sent first, not recorded
    assert [(r.status, r.error_kind) for r in records] == [
        ("rejected", "queue_full"),
        ("error", "http_500"),
        ("error", "incomplete"),
        ("ok", ""),
    ]
    assert records[0].http_status == 429 and "queue full" in records[0].reason
    assert len(records[2].chunk_times) == 4
    assert errors_by_kind(records) == {"http_500": 1, "incomplete": 1, "queue_full": 1}
    port = free_port()
    down = replay(
        reqs[3:], ReplayConfig(url=f"http://127.0.0.1:{port}", model="m", queue_metric=None, prime=False)
    )
    assert down.records[0].error_kind == "connect"


@pytest.fixture
def sim_backend() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sagegate.cli", "backend", "--port", str(port), "--time-scale", "20"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the simulated backend did not start: {err[-800:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.heavy
def test_replay_against_the_simulated_backend(sim_backend: str) -> None:
    work = prepare_workload(
        "synthetic",
        limit=40,
        rate=8.0,
        seed=4,
        prompts="filler",
        reader_opts={"prompt_mean": 300, "output_mean": 40},
    )
    cfg = ReplayConfig(url=sim_backend, time_scale=20.0, queue_metric="vllm:num_requests_running")
    result = replay(work.requests, cfg)
    for r, q in zip(result.records, work.requests, strict=True):
        assert r.status == "ok", (r.error_kind, r.reason)
        assert r.output_tokens == q.output_tokens == len(r.chunk_times)  # usage and one event per token
        assert r.prompt_tokens == q.prompt_tokens  # the backend's tokenizer agrees with the filler's count
        assert r.arrival_s <= (r.sent_s or 0) <= (r.first_token_s or 0) <= (r.finish_s or 0)
    assert result.queue_samples
    s = summarize(result.records)
    print(
        f"\nsim backend (engine time): TTFT p50 {s['ttft_p50_s'] * 1000:.1f} ms, "
        f"TPOT p50 {s['tpot_p50_s'] * 1000:.2f} ms"
    )


def test_progress_bar_does_not_disturb_the_replay(
    fake: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ReplayConfig(url=fake.url, progress=True, queue_metric=None, prime=False)
    result = replay(_requests(5, 0.05, output=10), cfg)
    assert all(r.status == "ok" for r in result.records)
    err = capsys.readouterr().err
    assert "replay" in err and "tok/s" in err and "5/5" in err


def test_max_tokens_is_the_client_cap_never_the_true_length(fake: FakeServer) -> None:
    """A recording stub sees one ``max_tokens`` for every request, whatever the trace's output; the
    true length is only in the forcing field, and an output beyond the cap is cut to it."""
    outputs = [1, 7, 40, 300, 5000, 9000]
    reqs = with_client_cap(
        [TraceRequest(0.01 * i, 12, o, rid=i, prompt=f"prompt {i}") for i, o in enumerate(outputs)], 4096
    )
    result = replay(reqs, ReplayConfig(url=fake.url, model="m", queue_metric=None, prime=False))
    sent = sorted(
        (x for x in fake.received if x.path == "/v1/completions"), key=lambda x: int(x.body["prompt"][7:])
    )
    assert [x.body["max_tokens"] for x in sent] == [4096] * len(outputs)
    assert [x.body[FORCED_OUTPUT_FIELD] for x in sent] == [min(o, 4096) for o in outputs]
    assert [r.output_tokens for r in result.records] == [min(o, 4096) for o in outputs]


def test_a_trace_that_records_a_cap_sends_its_own() -> None:
    reqs = with_client_cap([TraceRequest(0.0, 5, 50, max_tokens=64), TraceRequest(0.0, 5, 80)], 1024)
    assert [(r.max_tokens, r.output_tokens) for r in reqs] == [(64, 50), (1024, 80)]
    assert with_client_cap(reqs, None) == reqs


@pytest.mark.heavy
def test_preemptions_come_from_the_backends_counters() -> None:
    """A client cannot see preemptions: the replay reads the backends' ``vllm:num_preemptions`` before
    and after, and reports their difference (a small KV pool under a burst preempts)."""
    from sagegate.harness.procs import spawned

    args = ["--time-scale", "50", "--num-gpu-blocks-override", "96", "--max-num-seqs", "32"]
    with spawned("sagegate.cmd_backend", args) as url:
        reqs = [TraceRequest(0.001 * i, 300, 120, rid=i, prompt=filler_text(300, seed=i)) for i in range(16)]
        result = replay(reqs, ReplayConfig(url=url, time_scale=50.0, queue_metric=None, prime=False))
        text = httpx.get(url + "/metrics", timeout=5).text
    assert all(r.status == "ok" for r in result.records)
    from sagegate.loadgen.scrape import counter_total

    total = counter_total(text, "vllm:num_preemptions")
    assert total is not None and total > 0
    assert result.preemptions == total  # a fresh backend: everything it counted was this run's
