"""Workload timing: trace times scaled, re-timed to a rate, cut by duration and limit, warm-up marked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import data_path

from sagegate.core.record import RequestRecord
from sagegate.core.summary import mark_warmup, summarize
from sagegate.core.tokens import count_tokens
from sagegate.loadgen.schedule import prepare_workload


def _jsonl(tmp_path: Path, n: int = 40, gap_ms: int = 100) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [
        {
            "timestamp": 5000 + i * gap_ms,
            "input_length": 600 + i,
            "output_length": 5 + i,
            "hash_ids": [i % 3, 100 + i],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_times_are_rebased_and_scaled(tmp_path: Path) -> None:
    path = _jsonl(tmp_path)
    plain = prepare_workload(path).requests
    fast = prepare_workload(path, rate_scale=4.0).requests
    assert plain[0].arrival_s == 0.0
    assert plain[-1].arrival_s == pytest.approx(3.9)
    assert [r.arrival_s * 4 for r in fast] == pytest.approx([r.arrival_s for r in plain])
    assert [r.output_tokens for r in fast] == [r.output_tokens for r in plain]


def test_retime_to_a_rate_keeps_order_and_is_seeded(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, n=400)
    a = prepare_workload(path, rate=50.0, seed=3).requests
    b = prepare_workload(path, rate=50.0, seed=3).requests
    c = prepare_workload(path, rate=50.0, arrival="gamma", cv=3.0, seed=3).requests
    assert [r.arrival_s for r in a] == [r.arrival_s for r in b]
    assert [r.prompt_tokens for r in a] == list(range(600, 1000))
    gaps = np.diff([r.arrival_s for r in a])
    assert 1 / 65 < gaps.mean() < 1 / 38
    cgaps = np.diff([r.arrival_s for r in c])
    assert cgaps.std() / cgaps.mean() > 2 * gaps.std() / gaps.mean() * 0.9  # burstier
    with pytest.raises(ValueError, match="not both"):
        prepare_workload(path, rate=5.0, rate_scale=2.0)


def test_duration_limit_and_warmup(tmp_path: Path) -> None:
    path = _jsonl(tmp_path)
    w = prepare_workload(path, duration=1.0, warmup=0.35)
    assert [round(r.arrival_s, 6) for r in w.requests] == [round(0.1 * i, 6) for i in range(10)]
    assert w.measured == 6
    assert len(prepare_workload(path, limit=7).requests) == 7
    records = [
        RequestRecord(r.rid, r.arrival_s, r.prompt_tokens, 1, finish_s=r.arrival_s + 1) for r in w.requests
    ]
    mark_warmup(records, w.warmup_s)
    assert sum(r.warmup for r in records) == 4
    assert summarize(records)["requests"] == 6
    with pytest.raises(ValueError, match="covers the whole workload"):
        prepare_workload(path, warmup=100.0)
    with pytest.raises(ValueError, match="duration"):
        prepare_workload(path, duration=0.0)


def test_prompts_follow_the_trace_lengths_and_hash_ids(tmp_path: Path) -> None:
    w = prepare_workload(_jsonl(tmp_path, n=6), prompts="auto", seed=1)
    for r in w.requests:
        assert r.prompt is not None and count_tokens(r.prompt) == r.prompt_tokens
    same_first_block = [r for r in w.requests if r.hash_ids and r.hash_ids[0] == 0]
    assert len(same_first_block) == 2
    a, b = (r.prompt or "" for r in same_first_block)
    assert a[: 4 * 512] == b[: 4 * 512] and a[4 * 512 : 4 * 520] != b[4 * 512 : 4 * 520]


def test_synthetic_workload() -> None:
    w = prepare_workload("synthetic", limit=50, rate=20.0, prompts="filler", reader_opts={"prompt_mean": 64})
    assert len(w.requests) == 50 and w.fmt == "synthetic"
    assert all(count_tokens(r.prompt or "") == r.prompt_tokens for r in w.requests)


def test_real_traces_prepare() -> None:
    azure = data_path("azure2023", "AzureLLMInferenceTrace_conv.csv")
    w = prepare_workload(azure, limit=500, duration=60.0, rate_scale=2.0)
    assert w.fmt == "azure" and 0 < len(w.requests) <= 500
    assert all(r.arrival_s < 60.0 for r in w.requests)
    moon = data_path("mooncake", "synthetic_trace.jsonl")
    m = prepare_workload(moon, limit=50, rate=5.0, prompts="filler")
    assert m.fmt == "mooncake" and all(
        count_tokens(r.prompt or "") == r.prompt_tokens for r in m.requests[:5]
    )
    pairs = data_path("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
    s = prepare_workload(pairs, limit=20, prompts="trace")
    assert s.notes and all(r.prompt for r in s.requests)
