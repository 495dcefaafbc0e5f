"""The completion history a semantic predictor learns from: one record per finished request, and the
interface every store (in-process, Redis) implements.

A store only moves records: it hands the live window to a starting predictor and then delivers the
completions other replicas record. The predictor indexes its own completions itself, at once, so the
request path never waits on a store.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sagegate.predictor.embedder import DIM


@dataclass(frozen=True, slots=True, eq=False)
class Completion:
    """One completed request. ``embedding`` is a unit float32 vector; ``terms``/``counts`` are the
    prompt's hashed lexical terms and ``cues`` its length cues (:mod:`predictor.cues`; no text leaves the
    replica). ``ts`` is wall-clock seconds, shared by
    every replica, so age bounds agree across them."""

    id: str
    model: str
    embedding: np.ndarray
    prompt_tokens: int
    output_tokens: int
    ts: float
    tenant: str = "default"
    terms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint16))
    cues: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    # --- wire format (Redis stream fields) ----------------------------------------------------
    def to_fields(self) -> dict[str, bytes | str | int | float]:
        return {
            "id": self.id,
            "model": self.model,
            "emb": np.asarray(self.embedding, dtype="<f4").tobytes(),
            "pt": int(self.prompt_tokens),
            "ot": int(self.output_tokens),
            "ts": repr(float(self.ts)),
            "tenant": self.tenant,
            "terms": np.asarray(self.terms, dtype="<u4").tobytes(),
            "counts": np.asarray(self.counts, dtype="<u2").tobytes(),
            "cues": np.asarray(self.cues, dtype="<f4").tobytes(),
        }

    @staticmethod
    def from_fields(fields: Mapping[bytes, bytes], *, embedded: bool = True) -> Completion:
        """Inverse of :meth:`to_fields` (keys and values as bytes, the way redis-py returns them).
        ``embedded``: the record must carry an embedding (a semantic history); else it must not
        (a history baseline's: :mod:`predictor.shared_history`)."""
        f = {k.decode() if isinstance(k, bytes) else k: v for k, v in fields.items()}
        emb = np.frombuffer(f["emb"], dtype="<f4").astype(np.float32)
        want = (DIM,) if embedded else (0,)
        if emb.shape != want:
            raise ValueError(f"embedding of {emb.size} values, expected {want[0]}")
        return Completion(
            id=_text(f["id"]),
            model=_text(f["model"]),
            embedding=emb,
            prompt_tokens=int(f["pt"]),
            output_tokens=int(f["ot"]),
            ts=float(f["ts"]),
            tenant=_text(f.get("tenant", b"default")),
            terms=np.frombuffer(f.get("terms", b""), dtype="<u4").astype(np.uint32),
            counts=np.frombuffer(f.get("counts", b""), dtype="<u2").astype(np.uint16),
            cues=np.frombuffer(f.get("cues", b""), dtype="<f4").astype(np.float32),
        )


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


@dataclass(frozen=True, slots=True)
class WindowBounds:
    """The live history: at most ``max_entries`` records per model, none older than ``max_age_s``."""

    max_entries: int = 100_000
    max_age_s: float = 24 * 3600.0

    def horizon(self, now: float) -> float:
        """Records with ``ts`` below this have expired."""
        return -math.inf if math.isinf(self.max_age_s) else now - self.max_age_s


@dataclass
class StoreStats:
    """Plain counters (the gateway exports them as Prometheus metrics).

    ``degraded`` counts each moment the shared store failed (a failed or timed-out call); ``buffered``
    is how many completions wait to be written; ``dropped`` how many the bounded buffer had to let go.
    """

    appended: int = 0
    written: int = 0
    received: int = 0
    degraded: int = 0
    buffered: int = 0
    dropped: int = 0
    reseeds: int = 0
    connected: bool = True
    last_error: str = ""

    def as_dict(self) -> dict[str, float | str | bool]:
        return {
            "appended": self.appended,
            "written": self.written,
            "received": self.received,
            "degraded": self.degraded,
            "buffered": self.buffered,
            "dropped": self.dropped,
            "reseeds": self.reseeds,
            "connected": self.connected,
            "last_error": self.last_error,
        }


Deliver = Callable[[list[Completion]], None]


class HistoryStore(Protocol):
    """Where completions are kept and shared.

    ``start`` returns the live window (oldest first) and from then on calls ``deliver`` with records
    appended by *other* replicas. ``append`` never raises and never blocks on I/O.
    """

    def start(self, deliver: Deliver) -> list[Completion]: ...

    def append(self, record: Completion) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> StoreStats: ...


def wall_clock() -> float:
    return time.time()
