"""A static embedding distilled from the shipped MiniLM itself (model2vec's recipe): the alternative
embedder that runs offline here with no other model to hand.

Why: no second sentence-embedding model is on this machine's disk, and a static table costs a
tokenisation and a weighted mean (tens of microseconds) instead of a six-layer encoder pass. The table
is made once: every word piece of the vocabulary alone through MiniLM (``[CLS] piece [SEP]``, mean
pooled, via ONNX Runtime float32), centred and rotated onto its principal axes (PCA keeping all
:data:`STATIC_DIM`: the index takes 384), and weighted by ``log(1 + id)``: model2vec's Zipf
weighting, the BERT vocabulary being roughly in frequency order. The prompt's vector is the mean of
its pieces' rows over the widest window, unit length.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.predictor.embedder import WINDOWS, fit_window, model_dir
from sagegate.predictor.embedder_onnx import OnnxEmbedder, cache_root

STATIC_DIM = 384  # the index is built for MiniLM's width
STATIC_WINDOW = 256
STATIC_VERSION = f"minilm-l6-v2-static{STATIC_DIM}/head128-tail122/v1"


def default_table_path() -> Path:
    return cache_root() / "onnx" / f"minilm-static-{STATIC_DIM}.npy"


def distill(onnx_fp32: str | Path, out: str | Path, batch: int = 512) -> Path:
    """Make the table from the float32 ONNX model (see the module's docstring) and save it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
    size = tok.get_vocab_size()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    model = OnnxEmbedder(onnx_fp32, quantize=False, tuned=False).load()
    rows = np.empty((size, 384), dtype=np.float32)
    for at in range(0, size, batch):
        ids = np.array([[cls, i, sep] for i in range(at, min(size, at + batch))], dtype=np.int64)
        hidden = model.hidden(ids, np.ones_like(ids))
        rows[at : at + len(ids)] = hidden.mean(1)
    rows -= rows.mean(0)
    _, _, vt = np.linalg.svd(rows[:: max(1, size // 8000)], full_matrices=False)
    table = rows @ vt[:STATIC_DIM].T
    table *= np.log1p(np.arange(size, dtype=np.float32))[:, None]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npy")
    np.save(tmp, table.astype(np.float32))
    tmp.replace(out)
    return out


class StaticEmbedder:
    """Prompt → mean of its word pieces' rows in the distilled table, unit length."""

    dim = STATIC_DIM

    def __init__(self, table: str | Path) -> None:
        self.path = Path(table)
        self.window = WINDOWS[STATIC_WINDOW]
        self.version = STATIC_VERSION
        self._table: np.ndarray | None = None
        self._tok: Any = None
        self._lock = threading.Lock()

    def load(self) -> StaticEmbedder:
        with self._lock:
            if self._table is None:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
                tok.no_truncation()
                tok.no_padding()
                self._tok, self._table = tok, np.load(self.path)
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.load()
        assert self._table is not None
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            fitted = fit_window(
                text, self.window, lambda t: self._tok.encode(t, add_special_tokens=False).offsets
            )
            ids = self._tok.encode(fitted, add_special_tokens=False).ids
            if ids:
                out[i] = self._table[ids].mean(0)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
