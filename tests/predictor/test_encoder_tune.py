"""The shipped length tune: merged exactly, refused whole when it does not fit, named in every
embedding version (so tuned and stock vectors never share a history)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sagegate.predictor.embedder import EMBED_VERSION, MiniLMEmbedder, embed_version, model_dir
from sagegate.predictor.embedder_onnx import default_onnx_path, onnx_version
from sagegate.predictor.encoder_tune import (
    DEFAULT_TUNED,
    TUNE_PATH,
    TuneMismatch,
    merge_into,
    tune_id,
)
from sagegate.predictor.learned import trained_on

QUERY = "encoder.layer.0.attention.self.query"
OTHER = "encoder.layer.1.attention.self.query"
RNG = np.random.default_rng(7)


@pytest.fixture()
def model() -> Any:
    import transformers

    return transformers.AutoModel.from_pretrained(model_dir(), local_files_only=True).eval()


def weight(model: Any, name: str) -> np.ndarray:
    return model.get_submodule(name).weight.detach().numpy().copy()


def write_tune(path: Path, layers: dict[str, tuple[int, int]], rank: int = 4, scale: float = 0.5) -> dict:
    arrays: dict[str, np.ndarray] = {"scale": np.float32(scale), "trained_on": np.array([3, 5], np.uint64)}
    for name, (out, inp) in layers.items():
        arrays[name + ".lora_A"] = RNG.normal(size=(rank, inp)).astype(np.float16)
        arrays[name + ".lora_B"] = RNG.normal(size=(out, rank)).astype(np.float16)
    np.savez(path, **arrays)
    return arrays


def test_merging_adds_the_low_rank_change_and_touches_nothing_else(tmp_path: Path, model: Any) -> None:
    path = tmp_path / "tune.npz"
    arrays = write_tune(path, {QUERY: (384, 384)})
    before, other = weight(model, QUERY), weight(model, OTHER)
    assert merge_into(model, path) == 1
    want = 0.5 * arrays[QUERY + ".lora_B"].astype(np.float32) @ arrays[QUERY + ".lora_A"].astype(np.float32)
    np.testing.assert_allclose(weight(model, QUERY) - before, want, atol=1e-5)
    assert np.array_equal(weight(model, OTHER), other)
    assert trained_on(path) == frozenset({3, 5})
    assert tune_id(path) != tune_id(TUNE_PATH)


@pytest.mark.parametrize(
    "bad",
    [{"encoder.layer.9.attention.self.query": (384, 384)}, {OTHER: (384, 1536)}],
    ids=["absent", "shape"],
)
def test_a_tune_that_does_not_fit_is_refused_whole(tmp_path: Path, model: Any, bad: dict) -> None:
    path = tmp_path / "tune.npz"
    write_tune(path, {QUERY: (384, 384), **bad})
    before = weight(model, QUERY)
    with pytest.raises(TuneMismatch):
        merge_into(model, path)
    assert np.array_equal(weight(model, QUERY), before)  # the layer that did fit is unchanged too


def test_the_shipped_tune_is_on_by_default_and_named_in_every_version() -> None:
    assert DEFAULT_TUNED and TUNE_PATH.is_file()
    stock = embed_version(64, True, tuned=False)
    assert stock == "minilm-l6-v2/head32-tail27/v1/int8"  # the histories built before the tune
    assert EMBED_VERSION == embed_version() == f"{stock}/tune-{tune_id()}"
    assert onnx_version(64, True, tuned=True) == onnx_version(64, True, tuned=False) + f"/tune-{tune_id()}"
    assert default_onnx_path(True, tuned=True) != default_onnx_path(True, tuned=False)
    with np.load(TUNE_PATH, allow_pickle=False) as f:
        layers = [k for k in f.files if k.endswith(".lora_A")]
        assert len(layers) == 36 and all(f[k].dtype == np.float16 for k in layers)
    assert len(trained_on(TUNE_PATH)) >= 5000


@pytest.mark.heavy
def test_the_tuned_encoder_moves_the_vectors_and_keeps_their_sense() -> None:
    texts = [
        "Write a short poem about the sea.",
        "Compose a brief poem about the ocean.",
        "List every prime number below 100 and explain how you found them.",
    ]
    tuned = MiniLMEmbedder(quantize=False, tuned=True).embed(texts)
    stock = MiniLMEmbedder(quantize=False, tuned=False).embed(texts)
    assert (tuned * stock).sum(1).max() < 0.999  # the tune changed every vector
    assert tuned[0] @ tuned[1] > tuned[0] @ tuned[2]  # a paraphrase still sits nearer than another task
