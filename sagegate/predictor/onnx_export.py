"""Export an encoder (the shipped all-MiniLM-L6-v2, or a fetched one: :mod:`predictor.encoders`) to
ONNX, offline, for :mod:`predictor.embedder_onnx`.

The export needs torch (the ``embed`` extra) and the ``onnx`` package; the gateway that loads the file
needs neither. :func:`export_in_subprocess` runs the export in a child process so that a gateway
exporting on first use never imports torch itself. Every file is checked against the torch float32
vectors before it replaces anything, and written atomically (a temporary name, then a rename), so two
processes exporting at once leave one good file.

    python -m sagegate.predictor.onnx_export --out PATH [--fp32] [--stock] [--model minilm|mpnet]

The encoder's shipped length tune (:mod:`predictor.encoder_tune`) is merged into the weights first
unless ``tuned=False`` (``--stock``); the file's metadata names the encoder and the tune, and the
gateway refuses a file whose encoder or tune differs from what its settings ask for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.predictor.encoder_tune import DEFAULT_TUNED, merge_into, tune_id
from sagegate.predictor.encoders import DEFAULT_ENCODER, EncoderMissing, encoder, projection

OPSET = 17
PROBES = (
    "hello",
    "Write a 500 word essay about the history of Rome, with sources.",
    "Summarise the text above in three bullet points. " * 6,
)
MIN_COSINE = {False: 0.9999, True: 0.95}
"""Agreement with torch float32 a new file must show on :data:`PROBES` (int8: quantisation noise)."""


class ExportFailed(RuntimeError):
    """The export could not run here (torch or onnx missing) or made a file that disagrees."""


def export(
    out: str | Path, quantize: bool = True, tuned: bool = DEFAULT_TUNED, model_name: str = DEFAULT_ENCODER
) -> Path:
    """Write the encoder ``model_name`` to ``out`` (int8 per-channel weights when ``quantize``; its
    length tune merged when ``tuned``) and return its path."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ExportFailed(f"exporting needs torch and transformers (the embed extra): {exc}") from exc
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = encoder(model_name)
    try:
        path = str(spec.folder())
    except EncoderMissing as exc:
        raise ExportFailed(str(exc)) from exc
    # Eager attention: the exported graph is plain MatMul/Softmax, with no shape-dependent branch.
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    if tuned:
        merge_into(model, spec.tune)
    model = model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    # Before the export: tracing leaves the model changed.
    reference = _torch_vectors(model, tokenizer, spec.pieces or 256)
    enc = tokenizer(["an export example", "a"], padding=True, return_tensors="pt")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
        fp32 = Path(tmp) / "model.onnx"
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _last_hidden(model),
                (enc["input_ids"], enc["attention_mask"]),
                str(fp32),
                input_names=["input_ids", "attention_mask"],
                output_names=["last_hidden_state"],
                dynamic_axes={
                    name: {0: "batch", 1: "pieces"}
                    for name in ("input_ids", "attention_mask", "last_hidden_state")
                },
                opset_version=OPSET,
                dynamo=False,
            )
        made = fp32
        if quantize:
            made = Path(tmp) / "model-int8.onnx"
            _quantize(fp32, made, spec.int8_fp32_nodes)
        _name(made, tune_id(spec.tune) if tuned else "none", spec.name)
        project = projection(spec)
        _check(made, quantize, tuned, reference if project is None else project(reference), spec.name)
        made.replace(out)
    return out


def _last_hidden(model: Any) -> Any:
    """The encoder with its last hidden state as the only output (mean pooling stays outside, over
    the mask)."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return LastHidden()


def _quantize(src: Path, dst: Path, fp32_nodes: str | None = None) -> None:
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise ExportFailed(f"int8 export needs onnxruntime and onnx (the onnx extra): {exc}") from exc
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process is for static quantisation
    # Per-channel weights: measured on 200 ShareGPT prompts, cosine to float32 0.975 at worst against
    # 0.83 per tensor (torch's own int8 layers reach 0.80).
    if fp32_nodes is None:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True)
        return
    import re

    import onnx

    keep = [
        n.name
        for n in onnx.load(str(src)).graph.node
        if n.op_type == "MatMul" and re.search(fp32_nodes, n.name)
    ]
    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        nodes_to_exclude=keep,
    )


def _name(path: Path, tune: str, model_name: str) -> None:
    """Write the tune and the encoder into the file's metadata (what :class:`OnnxEmbedder` checks at
    load)."""
    import onnx

    from sagegate.predictor.embedder_onnx import ENCODER_KEY, TUNE_KEY

    model = onnx.load(str(path))
    for prop in list(model.metadata_props):
        if prop.key in (TUNE_KEY, ENCODER_KEY):
            model.metadata_props.remove(prop)
    for key, value in ((TUNE_KEY, tune), (ENCODER_KEY, model_name)):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))


def _torch_vectors(model: Any, tokenizer: Any, pieces: int) -> np.ndarray:
    """Unit mean-pooled float32 vectors of :data:`PROBES` from the eager torch model."""
    import torch

    with torch.inference_mode():
        enc = tokenizer(list(PROBES), padding=True, truncation=True, max_length=pieces, return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        ref: np.ndarray = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)


def _check(made: Path, quantize: bool, tuned: bool, reference: np.ndarray, model_name: str) -> None:
    """Refuse a file whose vectors stray from torch float32 on :data:`PROBES`."""
    from sagegate.predictor.embedder_onnx import OnnxEmbedder

    made_emb = OnnxEmbedder(made, quantize=quantize, window=256, tuned=tuned, model=model_name)
    cosines = (made_emb.embed(list(PROBES)) * reference).sum(1)
    worst = float(cosines.min())
    if worst < MIN_COSINE[quantize]:
        raise ExportFailed(f"the exported model disagrees with torch (cosine {worst:.4f})")


def export_in_subprocess(
    out: str | Path,
    quantize: bool = True,
    timeout_s: float = 600.0,
    tuned: bool = DEFAULT_TUNED,
    model_name: str = DEFAULT_ENCODER,
) -> Path:
    """:func:`export` in a child process (torch loads there, never here); raises :class:`ExportFailed`
    with the child's last words when it fails."""
    cmd = [sys.executable, "-m", "sagegate.predictor.onnx_export", "--out", str(out)]
    if not quantize:
        cmd.append("--fp32")
    if not tuned:
        cmd.append("--stock")
    cmd += ["--model", model_name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ExportFailed(f"the ONNX export took over {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ExportFailed("the ONNX export failed: " + " | ".join(tail))
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fp32", action="store_true", help="float32 weights (default: int8)")
    parser.add_argument("--stock", action="store_true", help="the stock weights, without the length tune")
    parser.add_argument("--model", default=DEFAULT_ENCODER, help="the encoder (predictor.encoders)")
    args = parser.parse_args(argv)
    try:
        print(export(args.out, quantize=not args.fp32, tuned=not args.stock, model_name=args.model))
    except ExportFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
