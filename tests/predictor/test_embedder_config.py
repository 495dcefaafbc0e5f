"""The embedder's configurations on the real MiniLM model: the fast default (64-piece window, int8)
against the first one (256 pieces, float32), which must stay reachable and give sentence-transformers'
vectors; int8 vectors independent of batch companions; one Redis history per embedding version."""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest

from sagegate.gateway.predict import build_predictor
from sagegate.gateway.settings_predictor import SemanticSettings
from sagegate.predictor.embedder import (
    DEFAULT_QUANTIZE,
    DEFAULT_WINDOW,
    EMBED_VERSION,
    WINDOWS,
    MiniLMEmbedder,
    embed_version,
)
from sagegate.predictor.encoder_tune import tune_id
from sagegate.predictor.factory import SemanticOptions, semantic_core
from sagegate.predictor.history import WindowBounds
from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor
from sagegate.predictor.semantic_face import SemanticLengthPredictor
from tests.semantic_support import real_embedder

pytestmark = pytest.mark.heavy  # the real MiniLM model

FIRST_VERSION = "minilm-l6-v2/head128-tail122/v1"  # histories built before the fast default
LONG = "Summarise the following. " + "filler words go here. " * 400 + "Answer in one word."
TEXTS = ["Translate into French: cat", "Write an essay on the history of the railways.", LONG]


@functools.lru_cache(maxsize=1)
def legacy() -> MiniLMEmbedder:
    return MiniLMEmbedder(window=256, quantize=False, tuned=False).load()


def test_default_is_a_new_version_and_the_first_stays_reachable() -> None:
    assert real_embedder().version == EMBED_VERSION == embed_version(DEFAULT_WINDOW, DEFAULT_QUANTIZE)
    assert EMBED_VERSION != FIRST_VERSION
    assert MiniLMEmbedder(window=256, quantize=False, tuned=False).version == FIRST_VERSION
    assert MiniLMEmbedder(window=256, quantize=False).version == FIRST_VERSION + f"/tune-{tune_id()}"
    versions = {embed_version(w, q) for w in WINDOWS for q in (False, True)}
    assert len(versions) == 2 * len(WINDOWS)
    with pytest.raises(ValueError):
        MiniLMEmbedder(window=100)


def test_first_configuration_gives_sentence_transformers_vectors() -> None:
    st = pytest.importorskip("sentence_transformers")
    from sagegate.predictor.embedder import model_dir

    reference = st.SentenceTransformer(model_dir(), device="cpu", local_files_only=True)
    reference.max_seq_length = 256
    emb = legacy()
    fitted = [emb.fit_text(t) for t in TEXTS]
    want = reference.encode(fitted, normalize_embeddings=True, convert_to_numpy=True)
    assert np.allclose(emb.embed(TEXTS), want, atol=1e-5)  # a batch (eager, padded)
    alone = np.stack([emb.embed([t])[0] for t in TEXTS])  # one at a time (traced)
    assert np.allclose(alone, want, atol=1e-5)


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_long_prompts_fit_each_window_with_head_and_tail(window: int) -> None:
    emb = MiniLMEmbedder(window=window)
    fitted = emb.fit_text(LONG)
    assert fitted.startswith("Summarise the following.") and fitted.endswith("Answer in one word.")
    assert len(emb.tokenizer(fitted)["input_ids"]) <= WINDOWS[window].max_tokens
    assert emb.fit_text(TEXTS[0]) == TEXTS[0]


def test_int8_vectors_do_not_depend_on_batch_companions() -> None:
    emb = real_embedder()
    assert emb.quantize  # the default; a padded int8 batch would shift the short prompt's vector
    together = emb.embed(TEXTS)
    alone = np.stack([emb.embed([t])[0] for t in TEXTS])
    assert np.array_equal(together, alone)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_fast_default_stays_close_to_the_first_configuration() -> None:
    short = TEXTS[:2]  # both fit every window: only int8 separates the two (the same tune)
    first_tuned = MiniLMEmbedder(window=256, quantize=False).load()
    cos = np.sum(real_embedder().embed(short) * first_tuned.embed(short), axis=1)
    assert np.all(cos > 0.9) and np.all(cos < 1.0 - 1e-6)


def test_gateway_options_choose_the_embedder() -> None:
    fast = build_predictor("semantic", options=SemanticSettings(embed_runtime="torch"))
    options = SemanticSettings.model_validate(
        {"embed_window": "256", "embed_quantize": "false", "embed_tuned": "false", "embed_runtime": "torch"}
    )
    first = build_predictor("semantic", options=options)
    assert isinstance(fast, SemanticLengthPredictor) and isinstance(first, SemanticLengthPredictor)
    try:
        assert fast.core.embedder.version == EMBED_VERSION
        assert first.core.embedder.version == FIRST_VERSION
    finally:
        fast.core.close()
        first.core.close()


def test_redis_history_is_kept_per_embedding_version(redis_url: str, redis_prefix: str) -> None:
    cfg = SemanticConfig(bounds=WindowBounds(1000, math.inf))

    def replica(emb: MiniLMEmbedder) -> SemanticPredictor:
        opts = SemanticOptions(embedder=emb, config=cfg, redis_url=redis_url, redis_prefix=redis_prefix)
        return semantic_core(opts).start()

    live = [replica(real_embedder()), replica(real_embedder()), replica(legacy())]
    writer, same, other = live
    try:
        writer.record_features(writer.features(TEXTS[1]), 12, 300)
        deadline = time.monotonic() + 10
        while same.size() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert same.size() == 1
        assert other.size() == 0  # another version's vectors never reach this index
        live += [replica(real_embedder()), replica(legacy())]  # rebuilt from the stream at start
        assert live[3].size() == 1 and live[4].size() == 0
    finally:
        for p in live:
            p.close()
