"""One model's live window of completions: an hnswlib cosine index over the embeddings, the lexical
index over the same rows, per-row lengths, and the window bounds.

Rows are small integers reused after expiry (hnswlib re-adding a deleted label updates it in place),
so memory follows the window, not the total ever seen. An int8 copy of each embedding (384 bytes)
gives the cosine of lexical-only candidates cheaply: hnswlib's ``get_items`` costs ~17 µs a vector.
When a burst of expiries leaves more deleted points than live ones, the graph is rebuilt from the live
points; in the background by default, with changes made meanwhile replayed before the swap. Every
method takes the index's lock: the gateway's request path, the store's consumer thread and the rebuild
thread share it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sagegate.predictor.history import Completion, WindowBounds
from sagegate.predictor.lexical import LexicalIndex, top_k


@dataclass(frozen=True)
class IndexConfig:
    """hnswlib parameters; ``background`` runs rebuilds on a thread (off for deterministic replays)."""

    dim: int = 384
    initial_capacity: int = 1024
    m: int = 16
    ef_construction: int = 100
    ef_search: int = 128
    seed: int = 0
    rebuild_min_deleted: int = 4096
    background: bool = True


@dataclass(frozen=True)
class Candidates:
    """Neighbour candidates of one query: rows, both similarities, and the rows' lengths."""

    rows: np.ndarray
    dense: np.ndarray
    lexical: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray

    @staticmethod
    def empty() -> Candidates:
        z = np.zeros(0)
        return Candidates(z.astype(np.int64), z, z, z, z)


class WindowIndex:
    def __init__(
        self,
        bounds: WindowBounds,
        config: IndexConfig | None = None,
        on_add: Callable[[Completion, float], None] | None = None,
    ) -> None:
        self.bounds = bounds
        self.config = config or IndexConfig()
        self.on_add = on_add
        self.lock = threading.RLock()
        self._hnsw: Any = self._new_hnsw(self.config.initial_capacity)
        self.lexical = LexicalIndex()
        cap = self.config.initial_capacity
        self.out_tokens = np.zeros(cap, dtype=np.int32)
        self.prompt_tokens = np.zeros(cap, dtype=np.int32)
        self.ts = np.zeros(cap, dtype=np.float64)
        self.q8 = np.zeros((cap, self.config.dim), dtype=np.int8)
        self.q8_scale = np.zeros(cap, dtype=np.float32)
        self._ids: list[str | None] = [None] * cap
        self._order: deque[int] = deque()  # rows, oldest first
        self._rows: dict[str, int] = {}
        self._free: list[int] = []
        self._next_row = 0
        self._deleted_rows: set[int] = set()
        self._journal: set[int] | None = None
        self._jobs: dict[str, threading.Thread] = {}
        self.rebuilds = 0

    # --- size ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, rid: str) -> bool:
        return rid in self._rows

    @property
    def deleted(self) -> int:
        """Points marked deleted in the current graph."""
        return len(self._deleted_rows)

    @property
    def capacity(self) -> int:
        return int(self._hnsw.get_max_elements())

    def live_output_tokens(self) -> np.ndarray:
        with self.lock:
            rows = np.fromiter(self._rows.values(), dtype=np.int64, count=len(self._rows))
            return self.out_tokens[rows].copy()

    # --- changes ------------------------------------------------------------------------------
    def add(self, rec: Completion, weights: np.ndarray, now: float) -> bool:
        """Index one completion (``weights``: its terms' TF-IDF weights). False when it is a
        duplicate or already outside the window."""
        with self.lock:
            if rec.id in self._rows or rec.ts < self.bounds.horizon(now):
                return False
            row = self._take_row()
            full = self._hnsw.get_current_count() >= self._hnsw.get_max_elements()
            if full and row not in self._deleted_rows:
                self._hnsw.resize_index(self._next_capacity(self._hnsw.get_max_elements()))
            self._hnsw.add_items(rec.embedding.reshape(1, -1), np.array([row]))
            self._deleted_rows.discard(row)  # re-adding a deleted label revives it
            self.out_tokens[row] = max(1, rec.output_tokens)
            self.prompt_tokens[row] = max(1, rec.prompt_tokens)
            self.ts[row] = rec.ts
            scale = float(np.abs(rec.embedding).max()) / 127.0 or 1.0
            self.q8[row] = np.rint(rec.embedding / scale).astype(np.int8)
            self.q8_scale[row] = scale
            self.lexical.add(row, rec.terms, weights)
            self._rows[rec.id] = row
            self._ids[row] = rec.id
            self._order.append(row)
            if self._journal is not None:
                self._journal.add(row)
            if self.on_add is not None:
                self.on_add(rec, now)
            self._expire_locked(now)
            self._maybe_rebuild_locked()
            return True

    def expire(self, now: float) -> int:
        with self.lock:
            n = self._expire_locked(now)
            self._maybe_rebuild_locked()
            return n

    def _next_capacity(self, current: int) -> int:
        """Grow by half, but never far past the window: hnswlib preallocates ~1.7 kB per slot."""
        limit = self.bounds.max_entries + 1024
        return max(current + 1, min(current + current // 2, limit))

    def _take_row(self) -> int:
        if self._free:
            return self._free.pop()
        row = self._next_row
        self._next_row += 1
        if row >= self.out_tokens.size:
            grow = max(row + 1, self._next_capacity(self.out_tokens.size))
            self.out_tokens = _grow(self.out_tokens, grow)
            self.prompt_tokens = _grow(self.prompt_tokens, grow)
            self.ts = _grow(self.ts, grow)
            self.q8 = _grow(self.q8, grow)
            self.q8_scale = _grow(self.q8_scale, grow)
            self._ids.extend([None] * (grow - len(self._ids)))
        return row

    def _expire_locked(self, now: float) -> int:
        horizon = self.bounds.horizon(now)
        n = 0
        while self._order and (
            len(self._order) > self.bounds.max_entries or self.ts[self._order[0]] < horizon
        ):
            self._remove_locked(self._order.popleft())
            n += 1
        return n

    def _remove_locked(self, row: int) -> None:
        rid = self._ids[row]
        self._ids[row] = None
        if rid is not None:
            del self._rows[rid]
        self._hnsw.mark_deleted(row)
        self._deleted_rows.add(row)
        self.lexical.remove(row)
        self._free.append(row)

    # --- rebuilds -----------------------------------------------------------------------------
    def _maybe_rebuild_locked(self) -> None:
        if self.lexical.needs_rebuild():
            self._run("lexical", self._rebuild_lexical)
        if self.deleted > max(self.config.rebuild_min_deleted, len(self._rows)) and self._journal is None:
            self._run("graph", self._rebuild_graph)

    def _run(self, name: str, job: Callable[[], None]) -> None:
        if not self.config.background:
            job()
            return
        running = self._jobs.get(name)
        if running is not None and running.is_alive():
            return
        self._jobs[name] = t = threading.Thread(target=job, name=f"sagegate-rebuild-{name}", daemon=True)
        t.start()

    def wait_rebuilds(self, timeout: float = 30.0) -> None:
        """Join running rebuild threads (tests, shutdown)."""
        for t in list(self._jobs.values()):
            t.join(timeout)

    def _rebuild_lexical(self) -> None:
        with self.lock:
            snap = self.lexical.snapshot()
        built = LexicalIndex.build(snap)
        with self.lock:
            self.lexical.install(snap, built)

    def _rebuild_graph(self) -> None:
        with self.lock:
            self._journal = set()
            snap = np.fromiter(self._rows.values(), dtype=np.int64, count=len(self._rows))
        # Read the vectors in chunks so queries are not held up; a row that changes meanwhile is in
        # the journal and gets its current vector at the swap.
        parts, kept = [], []
        for start in range(0, snap.size, 4096):
            with self.lock:
                chunk = np.array([r for r in snap[start : start + 4096] if self._ids[r] is not None])
                if chunk.size:
                    parts.append(self._hnsw.get_items(chunk, return_type="numpy"))
                    kept.append(chunk)
        rows = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        fresh = self._new_hnsw(self._next_capacity(max(self.config.initial_capacity, rows.size)))
        if rows.size:
            fresh.add_items(np.concatenate(parts), rows)
        with self.lock:
            live_now = set(self._rows.values())
            gone = set(rows.tolist()) - live_now
            for row in gone:
                fresh.mark_deleted(row)
            changed = sorted((self._journal or set()) & live_now)
            if changed:
                need = fresh.get_current_count() + len(changed)
                if need > fresh.get_max_elements():
                    fresh.resize_index(self._next_capacity(need))
                fresh.add_items(self._hnsw.get_items(changed, return_type="numpy"), np.array(changed))
            self._hnsw = fresh
            self._deleted_rows = gone
            self._journal = None
            self.rebuilds += 1

    def _new_hnsw(self, capacity: int) -> Any:
        import hnswlib

        c = self.config
        index = hnswlib.Index(space="cosine", dim=c.dim)
        index.init_index(max_elements=capacity, ef_construction=c.ef_construction, M=c.m, random_seed=c.seed)
        index.set_ef(c.ef_search)
        index.set_num_threads(1)
        return index

    # --- queries ------------------------------------------------------------------------------
    def search(
        self, vec: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray, k_dense: int, k_lexical: int
    ) -> Candidates:
        """Union of the ``k_dense`` nearest embeddings and the ``k_lexical`` best lexical matches, with
        both similarities filled in for every candidate."""
        with self.lock:
            live = len(self._rows)
            if not live:
                return Candidates.empty()
            d_rows, d_sim = self._dense_locked(vec, min(k_dense, live))
            m_rows, m_scores = self.lexical.match(q_terms, q_weights)
            l_rows, _ = top_k(m_rows, m_scores, k_lexical)
            extra = np.setdiff1d(l_rows, d_rows, assume_unique=True)
            rows = np.concatenate([d_rows, extra])
            dense = d_sim
            if extra.size:
                approx = (self.q8[extra].astype(np.float32) @ vec.astype(np.float32)) * self.q8_scale[extra]
                dense = np.concatenate([d_sim, approx])
            lex = np.zeros(rows.size)
            if m_rows.size:
                pos = np.minimum(np.searchsorted(m_rows, rows), m_rows.size - 1)
                hit = m_rows[pos] == rows
                lex[hit] = m_scores[pos[hit]]
            return Candidates(
                rows=rows,
                dense=dense.astype(np.float64),
                lexical=lex,
                output_tokens=self.out_tokens[rows].astype(np.float64),
                prompt_tokens=self.prompt_tokens[rows].astype(np.float64),
            )

    def dense(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest rows by cosine (for benchmarks and tests)."""
        with self.lock:
            return self._dense_locked(vec, min(k, len(self._rows)))

    def _dense_locked(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        q = vec.reshape(1, -1).astype(np.float32)
        ef = self.config.ef_search
        while True:
            try:
                self._hnsw.set_ef(max(ef, k))
                labels, dist = self._hnsw.knn_query(q, k=k)
                return labels[0].astype(np.int64), 1.0 - dist[0].astype(np.float64)
            except RuntimeError:
                # Too many deleted points near the query for this ef: widen, then shrink k.
                if ef < 4 * max(k, self.config.ef_search):
                    ef *= 2
                elif k > 1:
                    k //= 2
                else:
                    return np.zeros(0, dtype=np.int64), np.zeros(0)


def _grow(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((size, *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out
