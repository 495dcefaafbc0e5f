"""A verbatim repeat of a prompt in the window pulls the answer toward its outcome (``repeat_weight``),
where the neighbours' vote alone would dilute it among similar prompts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sagegate.predictor.embedder import EMBED_VERSION
from sagegate.predictor.index import IndexConfig
from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor


class _Given:
    dim = 384
    version = EMBED_VERSION

    def embed(self, texts: object) -> np.ndarray:
        raise RuntimeError("features are given")


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def predictor_with_history(weight: float) -> tuple[SemanticPredictor, np.ndarray]:
    """Forty similar prompts answered in ~100 tokens, and one of them (the query) once in 1,600."""
    cfg = replace(SemanticConfig(repeat_weight=weight, calibrate=False), index=IndexConfig(background=False))
    pred = SemanticPredictor(embedder=_Given(), config=cfg, clock=lambda: 0.0)
    rng = np.random.default_rng(11)  # the same history for every weight
    base = rng.normal(size=384)
    query = unit(base)
    for i in range(40):
        vec = unit(base + 0.35 * rng.normal(size=384))
        feats = pred.features_from(vec, f"summarise the report number {i} in a few lines")
        pred.record_features(feats, 50, int(rng.integers(80, 120)), ts=0.0, rid=f"n{i}")
    feats = pred.features_from(query, "summarise the report number 7 in a few lines")
    pred.record_features(feats, 60, 1600, ts=0.0, rid="repeat")
    return pred, query


def test_a_repeat_moves_the_answer_toward_its_outcome() -> None:
    text = "summarise the report number 7 in a few lines"
    means = {}
    for weight in (0.0, 0.75):
        pred, query = predictor_with_history(weight)
        p = pred.predict_features(pred.features_from(query, text), 60)
        assert p.path == "semantic"
        means[weight] = p.mean
        other = pred.predict_features(pred.features_from(query, text), 61)  # another prompt length
        means[(weight, "other")] = other.mean
        pred.close()
    assert means[0.75] > 2 * means[0.0]  # toward 1,600 from ~100-odd
    assert means[(0.75, "other")] == means[(0.0, "other")]  # not a repeat: untouched
