"""The shipped length tune: a low-rank change to all-MiniLM-L6-v2's linear layers that makes its
embedding rank output lengths better, merged into the weights when the model loads.

Why: a linear head or a kNN over the frozen sentence embedding tops out near Kendall tau-b 0.40 on the
ShareGPT tail (docs/journal/BENCHMARKS.md, *The ranking head, its shipped prior, calibrated
spread*). Trained with a length loss (``tools/make_encoder_tune.py``),
a rank-16 change on the 36 linear layers moves the same encoder's neighbours and head closer to what
decides a response's length. Merged (``W + scale · B @ A``), the tuned encoder has the stock shape, so
the torch and ONNX paths and the int8 export all work as before, at the same cost per prompt.

The file (``predictor/data/encoder_tune.npz``, source and licence in ``ENCODER_TUNE.md``) holds, per
layer, ``<module>.lora_A`` (rank × in) and ``<module>.lora_B`` (out × rank) in float16, the ``scale``,
and ``trained_on``: the :func:`core.request.prompt_digest` of every prompt training or model selection
saw, so that replays judging the predictor leave them out. Its content digest names the embedding
version (``…/tune-<digest>``): vectors of the tuned and the stock encoder never share a history.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

TUNE_PATH = Path(__file__).parent / "data" / "encoder_tune.npz"
DEFAULT_TUNED = TUNE_PATH.is_file()
"""The gateway, the demo and the evaluations embed with the tuned encoder unless told otherwise (the
file is package data; an install without it embeds with the stock weights, under their own version)."""


class TuneMismatch(RuntimeError):
    """The tune file does not fit the model it is merged into (a module missing or of another shape)."""


@lru_cache(maxsize=4)
def tune_id(path: Path = TUNE_PATH) -> str:
    """Eight hex digits of the file's SHA-256: part of the embedding version of the tuned encoder."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8]


def version_suffix(tuned: bool, path: Path = TUNE_PATH) -> str:
    """What the tune adds to an embedding version: ``/tune-<id>``, or nothing for the stock encoder."""
    return f"/tune-{tune_id(path)}" if tuned else ""


def merge_into(model: Any, path: Path = TUNE_PATH) -> int:
    """Add the tune to ``model``'s float32 linear weights in place (a transformers BertModel, before any
    quantisation); returns how many layers changed. Raises :class:`TuneMismatch` when the file names a
    module ``model`` lacks or holds another shape, leaving ``model`` unchanged."""
    import torch

    with np.load(path, allow_pickle=False) as f:
        scale = float(f["scale"])
        names = sorted(k[: -len(".lora_A")] for k in f.files if k.endswith(".lora_A"))
        deltas = {}
        for name in names:
            try:
                weight = model.get_submodule(name).weight
            except AttributeError as exc:
                raise TuneMismatch(f"the tune names {name}, which the model lacks") from exc
            delta = scale * (f[name + ".lora_B"].astype(np.float32) @ f[name + ".lora_A"].astype(np.float32))
            if tuple(delta.shape) != tuple(weight.shape):
                raise TuneMismatch(f"{name}: tune {delta.shape} against weight {tuple(weight.shape)}")
            deltas[name] = (weight, delta)
    with torch.no_grad():
        for weight, delta in deltas.values():
            weight.add_(torch.from_numpy(delta).to(weight.dtype))
    return len(deltas)
