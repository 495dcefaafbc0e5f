"""The ONNX Runtime embedder against the torch one on the real MiniLM weights: the same words read, the
same float32 vectors, int8 close to them; no torch in a process on the ONNX path; a missing file
exported, refused or replaced by torch as the settings say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sagegate.gateway.settings_predictor import SemanticSettings
from sagegate.predictor.embedder import WINDOWS, MiniLMEmbedder, embed_version, flatten_prompt
from sagegate.predictor.embedder_onnx import OnnxEmbedder, OnnxModelMissing, default_onnx_path, onnx_version
from sagegate.predictor.factory import EmbedderOptions, SemanticOptions, make_embedder
from sagegate.predictor.onnx_export import ExportFailed, export_in_subprocess
from tests.semantic_support import LONG_TASKS, SHORT_TASKS, family

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
LONG = "Summarise the following. " + "filler words go here. " * 400 + "Answer in one word."
CHAT = flatten_prompt(
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
)
SAMPLE = [*family(SHORT_TASKS, ["cats", "rain"]), *family(LONG_TASKS, ["trains"]), LONG, CHAT, "x", "   "]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both precisions, made as a gateway makes them: the factory exports a missing file (int8) in a
    child process; the float32 one through the same child directly."""
    root = tmp_path_factory.mktemp("onnx")
    int8 = root / "int8.onnx"
    made = make_embedder(EmbedderOptions(onnx_path=str(int8), onnx_missing="export"))
    assert isinstance(made, OnnxEmbedder) and int8.is_file()
    fp32 = export_in_subprocess(root / "fp32.onnx", quantize=False)
    return {"int8": int8, "fp32": fp32}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


@pytest.mark.heavy
@pytest.mark.parametrize("window", [64, 256])
def test_float32_onnx_gives_the_torch_vectors(files: dict[str, Path], window: int) -> None:
    torch_emb = MiniLMEmbedder(quantize=False, window=window)
    onnx_emb = OnnxEmbedder(files["fp32"], quantize=False, window=window)
    assert [onnx_emb.fit_text(t) for t in SAMPLE] == [torch_emb.fit_text(t) for t in SAMPLE]
    want = torch_emb.embed(SAMPLE)
    assert cosines(onnx_emb.embed(SAMPLE), want).min() >= 0.999  # a padded batch
    alone = np.stack([onnx_emb.embed([t])[0] for t in SAMPLE])
    assert cosines(alone, want).min() >= 0.999
    assert onnx_emb.version == torch_emb.version == embed_version(window, quantize=False)


@pytest.mark.heavy
def test_int8_onnx_stays_close_to_float32_and_has_its_own_version(files: dict[str, Path]) -> None:
    emb = OnnxEmbedder(files["int8"], quantize=True)
    ref = MiniLMEmbedder(quantize=False).embed(SAMPLE)
    got = emb.embed(SAMPLE)
    assert cosines(got, ref).min() >= 0.95
    assert np.array_equal(got, np.stack([emb.embed([t])[0] for t in SAMPLE]))  # batch-independent
    assert emb.version == onnx_version(64, True) != MiniLMEmbedder(quantize=True).version
    assert len({onnx_version(w, q) for w in WINDOWS for q in (False, True)}) == 2 * len(WINDOWS)


@pytest.mark.heavy
def test_a_file_made_with_another_tune_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    """The file's metadata names the tune merged into it; vectors of another encoder never load
    under this one's version (they would poison a shared history). Both ways, each error naming
    the export that fixes it; a stock export (``--stock``, in its child process) gives the stock
    encoder's vectors."""
    assert OnnxEmbedder(files["int8"], tuned=True).embed(["hello"]).shape == (1, 384)
    with pytest.raises(OnnxModelMissing, match=r"export-onnx --stock --out .*embed_tuned: true"):
        OnnxEmbedder(files["int8"], tuned=False).embed(["hello"])
    stock = export_in_subprocess(tmp_path / "stock.onnx", quantize=True, tuned=False)
    with pytest.raises(OnnxModelMissing, match=r"export-onnx --out .*embed_tuned: false"):
        OnnxEmbedder(stock, tuned=True).embed(["hello"])
    got = OnnxEmbedder(stock, tuned=False).embed(SAMPLE)
    assert cosines(got, MiniLMEmbedder(quantize=False, tuned=False).embed(SAMPLE)).min() >= 0.95
    assert cosines(got, MiniLMEmbedder(quantize=False, tuned=True).embed(SAMPLE)).min() < 0.95


@pytest.mark.heavy
def test_onnx_path_never_imports_torch(files: dict[str, Path]) -> None:
    """The gateway's predictor, built from its settings, warmed and asked once, in a fresh process."""
    code = f"""
import asyncio, json, sys
from sagegate.gateway.predict import build_predictor
from sagegate.gateway.settings_predictor import SemanticSettings
opts = SemanticSettings(onnx_file={str(files["int8"])!r}, onnx_missing="error")
p = build_predictor("semantic", options=opts)
p.core.warm_up()
vec = p.core.embedder.embed(["Write a long story about a lighthouse."])
heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
print(json.dumps({{"heavy": heavy, "dim": int(vec.shape[1]), "version": p.core.embedder.version}}))
p.core.close()
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"heavy": [], "dim": 384, "version": onnx_version(64, True)}


@pytest.mark.heavy
def test_missing_file_is_refused_or_replaced_by_torch_as_set(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.onnx")
    with pytest.raises(
        OnnxModelMissing, match=r"absent\.onnx.*sagegate predictor export-onnx.*embed_runtime"
    ):
        make_embedder(EmbedderOptions(onnx_path=missing, onnx_missing="error"))
    fallback = make_embedder(EmbedderOptions(onnx_path=missing, onnx_missing="torch"))
    assert isinstance(fallback, MiniLMEmbedder) and fallback.version == embed_version()
    with pytest.raises(OnnxModelMissing, match="export-onnx"):
        OnnxEmbedder(missing).embed(["hello"])
    assert isinstance(make_embedder(EmbedderOptions(runtime="torch")), MiniLMEmbedder)
    with pytest.raises(ValueError, match="runtime"):
        make_embedder(EmbedderOptions(runtime="tensorflow"))


@pytest.mark.heavy
def test_a_failed_export_says_why(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    target = blocked / "model.onnx"  # its parent cannot be made
    with pytest.raises(ExportFailed, match="export failed"):
        export_in_subprocess(target)
    with pytest.raises(OnnxModelMissing, match=r"export failed.*embed_runtime: torch"):
        make_embedder(EmbedderOptions(onnx_path=str(target), onnx_missing="export"))


def test_gateway_settings_choose_the_runtime(tmp_path: Path) -> None:
    default = SemanticSettings().factory_options()
    assert isinstance(default, SemanticOptions)
    assert (default.embed.runtime, default.embed.onnx_missing, default.embed.onnx_path) == (
        "onnx",
        "export",
        None,
    )
    set_ = SemanticSettings.model_validate(
        {"embed_runtime": "torch", "onnx_file": "/m.onnx", "onnx_missing": "error"}
    ).factory_options()
    assert isinstance(set_, SemanticOptions)
    assert (set_.embed.runtime, set_.embed.onnx_path, set_.embed.onnx_missing) == (
        "torch",
        "/m.onnx",
        "error",
    )
    for bad in ({"embed_runtime": "tf"}, {"onnx_missing": "ignore"}):
        with pytest.raises(ValidationError):
            SemanticSettings.model_validate(bad)
    assert default_onnx_path(True) != default_onnx_path(False)


def test_static_table_embeds_the_widest_window_to_unit_vectors(tmp_path: Path) -> None:
    """The comparison's static embedder on a made-up table: the head and tail of a long prompt decide
    its vector, an empty prompt gives zeros, the rest unit length."""
    from sagegate.predictor.embedder_static import STATIC_DIM, StaticEmbedder

    rng = np.random.default_rng(0)
    table = tmp_path / "table.npy"
    np.save(table, rng.normal(size=(30522, STATIC_DIM)).astype(np.float32))
    emb = StaticEmbedder(table)
    middle = "Summarise this. " + "filler words go here. " * 400 + "Answer in one word."
    other = "Summarise this. " + "different words sit here. " * 400 + "Answer in one word."
    vecs = emb.embed([middle, other, "   ", "cats"])
    assert vecs.shape == (4, STATIC_DIM)
    assert np.allclose(np.linalg.norm(vecs[[0, 1, 3]], axis=1), 1.0, atol=1e-5)
    assert not vecs[2].any()
    assert float(vecs[0] @ vecs[1]) < 0.999  # the window reaches past the shared head and tail


def test_export_command_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sagegate.cmd_predictor import predictor_app

    bad = CliRunner().invoke(predictor_app, ["export-onnx", "--precision", "int4"])
    assert bad.exit_code != 0 and "int8, fp32, both" in bad.output
    both = CliRunner().invoke(
        predictor_app, ["export-onnx", "--precision", "both", "--out", str(tmp_path / "m")]
    )
    assert both.exit_code != 0 and "one file" in both.output
