"""A history baseline (``global``, ``length-bucket``) whose completions every gateway replica shares.

Each replica otherwise learns only from the requests it served itself: with N replicas behind a
balancer, each one's window holds a 1/N sample of the fleet's outcomes, so early on (and after every
shift in the traffic) each replica's distribution is noisier than one gateway's would be. The shared
admission ledger then weighs charges whose predictions disagree replica to replica, and the replica
predicting shortest admits most. (Measured in the simulator on ``bench_replicas``'s workload: three
replicas learning apart preempted 1.29x what one gateway did, three sharing one history 0.94x; see
RESULTS.md, *Several replicas, one ledger*.)

Records travel through the same store the semantic predictor uses (:class:`HistoryStore`, Redis in
service) with no embedding: the prompt length, the output length, the model and the tenant. The
store's reader thread delivers other replicas' records; a lock keeps the inner predictor to one
caller at a time (the event loop predicts and records, the reader delivers).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from sagegate.core.distribution import LengthDistribution
from sagegate.core.predictor import InlinePredictor
from sagegate.core.request import PredictionQuery
from sagegate.predictor.history import Completion, HistoryStore, StoreStats, wall_clock

log = logging.getLogger(__name__)

NO_EMBEDDING = np.zeros(0, dtype=np.float32)
NO_TERMS = np.zeros(0, dtype=np.uint32)


@runtime_checkable
class KeyedHistory(Protocol):
    """A baseline that learns under a key of the prompt (``prefix``): its records carry the key as
    their terms, so every replica learns under it too (never the prompt)."""

    def record_terms(self, req: PredictionQuery) -> np.ndarray: ...

    def learn_terms(self, terms: np.ndarray, output_tokens: int) -> None: ...


class SharedHistory(InlinePredictor):
    """``inner`` (an inline predictor learning from outcomes alone), fed every replica's completions
    through ``store``. Await :meth:`start` before serving and :meth:`close` after."""

    def __init__(
        self, inner: InlinePredictor, store: HistoryStore, *, clock: Callable[[], float] = wall_clock
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.store = store
        self.clock = clock
        self.received = 0
        """Other replicas' completions learnt from (the window loaded at start included)."""
        self._lock = threading.Lock()

    def load(self) -> int:
        """Learn the live window from the store and start hearing the other replicas; returns how
        many records the window held."""
        records = self.store.start(self._deliver)
        self._deliver(records)
        return len(records)

    async def start(self) -> None:
        loaded = await asyncio.to_thread(self.load)
        log.info("%s predictor: %d completions from the shared history", self.name, loaded)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)

    def stats(self) -> StoreStats:
        return self.store.stats()

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        with self._lock:
            return self.inner.predict_inline(req)

    def observe_inline(self, req: PredictionQuery, output_tokens: int) -> None:
        with self._lock:
            self.inner.observe_inline(req, output_tokens)
        self.store.append(
            Completion(
                id=Completion.new_id(),
                model=req.model or "",
                embedding=NO_EMBEDDING,
                prompt_tokens=req.prompt_tokens,
                output_tokens=output_tokens,
                ts=self.clock(),
                tenant=req.tenant,
                terms=self.inner.record_terms(req) if isinstance(self.inner, KeyedHistory) else NO_TERMS,
            )
        )

    def _deliver(self, records: list[Completion]) -> None:
        with self._lock:
            for rec in records:
                query = PredictionQuery(
                    rid=0, prompt_tokens=rec.prompt_tokens, tenant=rec.tenant, model=rec.model or None
                )
                self.inner.observe_inline(query, rec.output_tokens)
                if isinstance(self.inner, KeyedHistory):
                    self.inner.learn_terms(rec.terms, rec.output_tokens)
            self.received += len(records)
