"""The opt-in encoder (``embed_model: mpnet``) on its real weights, fetched once
(``sagegate predictor fetch-encoder mpnet``; skipped when this machine has not fetched them): exported
with its tune merged, it reads MiniLM's window text, gives 384-d unit vectors close to torch float32
through the shipped projection, keeps its own history version and prior, refuses another encoder's
file, and the gateway's predictor runs on it without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sagegate.gateway.predict import build_predictor
from sagegate.gateway.settings_predictor import SemanticSettings
from sagegate.predictor.embedder import MiniLMEmbedder, embed_version
from sagegate.predictor.embedder_onnx import OnnxEmbedder, OnnxModelMissing, onnx_version
from sagegate.predictor.encoder_tune import merge_into
from sagegate.predictor.encoders import MPNET, EncoderMissing, projection
from sagegate.predictor.factory import EmbedderOptions, make_embedder
from sagegate.predictor.ranker_prior import MPNET_PRIOR_PATH, encoder_family, prior_path, shipped_prior
from tests.semantic_support import LONG_TASKS, SHORT_TASKS, family

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = [
    *family(SHORT_TASKS, ["cats", "rain"]),
    *family(LONG_TASKS, ["trains"]),
    "Summarise the following. " + "filler words go here. " * 400 + "Answer in one word.",
    "x",
]


def _weights() -> Path:
    try:
        return MPNET.folder()
    except EncoderMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def int8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Exported as the gateway exports a missing file: by the factory, in a child process."""
    _weights()
    path = tmp_path_factory.mktemp("mpnet") / "mpnet-int8.onnx"
    made = make_embedder(EmbedderOptions(model="mpnet", onnx_path=str(path), onnx_missing="export"))
    assert isinstance(made, OnnxEmbedder) and path.is_file()
    return path


def _torch_reference(texts: list[str]) -> np.ndarray:
    """The tuned encoder in torch float32, reading the same window text, pooled and projected."""
    import torch
    import transformers

    folder = str(_weights())
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(folder, local_files_only=True)
    merge_into(model, MPNET.tune)
    window = MiniLMEmbedder(quantize=False)
    rows = []
    with torch.inference_mode():
        for text in texts:
            enc = tok([window.fit_text(text)], truncation=True, max_length=MPNET.pieces, return_tensors="pt")
            rows.append(model(**enc).last_hidden_state[0].mean(0).numpy())
    v = np.stack(rows)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    project = projection(MPNET)
    assert project is not None
    return project(v)


@pytest.mark.heavy
def test_int8_vectors_are_close_to_torch_float32_through_the_projection(int8: Path) -> None:
    pytest.importorskip("torch")
    emb = OnnxEmbedder(int8, model="mpnet")
    got = emb.embed(SAMPLE)
    assert got.shape == (len(SAMPLE), 384) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(got, np.stack([emb.embed([t])[0] for t in SAMPLE]))  # batch-independent
    assert (got * _torch_reference(SAMPLE)).sum(1).min() >= 0.95
    # The window is MiniLM's: the encoder reads the same words the shipped one does.
    assert [emb.fit_text(t) for t in SAMPLE] == [MiniLMEmbedder().fit_text(t) for t in SAMPLE]


@pytest.mark.heavy
def test_its_vectors_keep_the_task_structure(int8: Path) -> None:
    """Nearest neighbours stay within a kind of task (what the kNN and the head rely on)."""
    short, long = family(SHORT_TASKS, ["apples", "chess"]), family(LONG_TASKS, ["apples", "chess"])
    v = OnnxEmbedder(int8, model="mpnet").embed(short + long)
    sims = v @ v.T
    np.fill_diagonal(sims, -1)
    kind = np.array([0] * len(short) + [1] * len(long))
    assert (kind[sims.argmax(1)] == kind).mean() >= 0.9


@pytest.mark.heavy
def test_it_has_its_own_history_and_prior(int8: Path) -> None:
    version = OnnxEmbedder(int8, model="mpnet").version
    assert version == onnx_version(64, True, True, "mpnet")
    assert version.startswith("mpnet-base-v2/p80/pca-") and "/onnx-int8/tune-" in version
    assert version not in {onnx_version(64, True, True), embed_version()}
    assert encoder_family(version).startswith("mpnet-base-v2/tune-")
    assert prior_path(version) == MPNET_PRIOR_PATH and shipped_prior(version) is not None
    assert shipped_prior(onnx_version(64, True, True)) is not shipped_prior(version)


@pytest.mark.heavy
def test_another_encoders_file_is_refused(int8: Path, tmp_path: Path) -> None:
    with pytest.raises(OnnxModelMissing, match="holds the mpnet encoder, not minilm"):
        OnnxEmbedder(int8, model="minilm").embed(["hello"])
    minilm = tmp_path / "minilm.onnx"
    make_embedder(EmbedderOptions(onnx_path=str(minilm), onnx_missing="export"))
    with pytest.raises(OnnxModelMissing, match=r"holds the minilm encoder, not mpnet.*--model mpnet"):
        OnnxEmbedder(minilm, model="mpnet").embed(["hello"])


def test_settings_keep_it_on_onnx() -> None:
    with pytest.raises(ValidationError, match="embed_model: mpnet runs on embed_runtime: onnx only"):
        SemanticSettings(embed_model="mpnet", embed_runtime="torch")
    with pytest.raises(ValidationError, match="onnx_missing: torch cannot stand in"):
        SemanticSettings(embed_model="mpnet", onnx_missing="torch")
    with pytest.raises(ValidationError, match="embed_model"):
        SemanticSettings(embed_model="bert")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="onnx runtime only"):
        make_embedder(EmbedderOptions(model="mpnet", runtime="torch"))


@pytest.mark.heavy
def test_the_gateway_predictor_runs_on_it_without_torch(int8: Path) -> None:
    """Built from the gateway's settings in a fresh process: warmed, asked, taught, asked again."""
    code = f"""
import asyncio, json, sys
from sagegate.core.request import PredictionQuery
from sagegate.gateway.predict import build_predictor
from sagegate.gateway.settings_predictor import SemanticSettings
opts = SemanticSettings(embed_model="mpnet", onnx_file={str(int8)!r}, onnx_missing="error")
p = build_predictor("semantic", options=opts)
p.core.warm_up()
async def go():
    query = PredictionQuery(0, 12, "Write a long story about a lighthouse keeper.", model="m")
    first = await p.predict(query)
    for _ in range(3):
        await p.observe(query, 900)
    again = await p.predict(query)
    return first.distribution.mean, again.distribution.mean, first.path, again.path
first, again, path, path2 = asyncio.run(go())
heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
print(json.dumps({{"heavy": heavy, "version": p.core.embedder.version, "paths": [path, path2],
                  "moved": abs(again - 900) < abs(first - 900)}}))
p.core.close()
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["version"] == onnx_version(64, True, True, "mpnet")
    assert out["paths"][1] == "semantic" and out["moved"]


def test_a_missing_weights_folder_stops_the_gateway_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAGEGATE_MPNET_DIR", str(tmp_path / "absent"))
    opts = SemanticSettings(embed_model="mpnet", onnx_file=str(tmp_path / "none.onnx"), onnx_missing="export")
    with pytest.raises(OnnxModelMissing, match="fetch-encoder mpnet"):
        build_predictor("semantic", options=opts)
