"""Sources with prompt text get ``semantic`` cells, fed by distributions computed outside the loop."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from loadgen.records import TraceRequest
from study.calibrate import Calibration
from study.config import StudyConfig
from study.semantic import history_rows, semantic_distributions
from study.simrun import Entry
from study.sweep import SEMANTIC, plan, run_batch
from study.windows import make_windows


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
    dists = semantic_distributions(rows, wins, history=150, embedder=HashEmbedder())
    assert set(dists) == {w.id for w in wins}
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
