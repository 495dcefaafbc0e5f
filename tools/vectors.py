"""Every ShareGPT item's vector from a named encoder, cached: what the build tools and the predictor
benchmarks embed with (``make_encoder_tune --teacher``, ``bench_ranker``, ``select_semantic``)."""

from __future__ import annotations

import numpy as np

from sagegate.predictor.embedder import MiniLMEmbedder, TextEmbedder, flatten_prompt
from sagegate.predictor.evaluate import EvalItem, embed_cached
from sagegate.predictor.factory import EmbedderOptions, make_embedder

ENCODERS = ("stock", "tuned", "tuned-onnx", "mpnet")
"""``stock``/``tuned``: MiniLM on torch int8 (the evaluations' usual); ``tuned-onnx``: tuned MiniLM on
ONNX int8 (what the gateway serves); ``mpnet``: the opt-in tuned all-mpnet-base-v2 on ONNX int8."""


def encoder_vectors(items: list[EvalItem], encoder: str) -> tuple[np.ndarray, str]:
    """Every item's vector from the named encoder (window 64), and that encoder's embedding version."""
    emb: TextEmbedder
    if encoder in ("stock", "tuned"):
        emb = MiniLMEmbedder(tuned=encoder == "tuned")
    else:
        emb = make_embedder(EmbedderOptions(model="mpnet" if encoder == "mpnet" else "minilm"))
    version = str(getattr(emb, "version", "?"))
    return embed_cached([flatten_prompt(it.prompt) for it in items], emb), version
