"""The embedding worker: one thread in front of an embedder, serving the requests that can still
make their budget first.

Why: the gateway waits at most its budget for an embedding and then ranks the request from the
prompt-length prior (``late``), but the embedding still completes, for the outcome to be recorded
under it. In arrival order, a burst that made one embedding late made the next ones late too (each
waited behind passes nobody was waiting for any more), and under sustained load nearly every
prediction went late. Here a job carries its deadline: the worker takes the job with the earliest
deadline still ahead, and a job whose caller gave up (its deadline passed) or that has none (an
outcome to record) waits until no live job does, oldest first.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from sagegate.predictor.embedder import EMBED_VERSION, TextEmbedder


@dataclass(order=True, slots=True)
class _Job:
    deadline: float
    """Monotonic seconds by which the caller wants the vector; ``inf``: nobody waits."""
    seq: int
    text: str = field(compare=False)
    future: Future[np.ndarray] = field(compare=False)


class BatchingEmbedder:
    """One worker thread in front of an embedder; concurrent callers are micro-batched.

    The worker takes the most urgent waiting job, then whatever else is queued or arrives within
    ``window_s`` (or until ``max_batch``), most urgent first, and embeds them in one call. The default
    window is zero: a lone request never waits, and under load requests pile up during a pass anyway.
    Callers get a :class:`concurrent.futures.Future` (``submit``; ``asyncio.wrap_future`` to await
    it), giving the seconds they will wait (``budget_s``) or none; an embedding failure is set on
    every future of the batch. Without budgets the jobs are served in arrival order.
    """

    def __init__(self, embedder: TextEmbedder, window_s: float = 0.0, max_batch: int = 32) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.version: str = getattr(embedder, "version", EMBED_VERSION)
        self.window_s = window_s
        self.max_batch = max_batch
        self.batches = 0
        self.items = 0
        self.expired = 0
        """Jobs whose deadline passed before the worker reached them (served later, in idle time)."""
        self._live: list[_Job] = []  # by deadline
        self._rest: list[tuple[int, _Job]] = []  # by arrival
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _ensure_worker(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="sagegate-embedder", daemon=True)
                self._thread.start()

    def submit(self, text: str, budget_s: float | None = None) -> Future[np.ndarray]:
        fut: Future[np.ndarray] = Future()
        self._ensure_worker()
        deadline = math.inf if budget_s is None else time.monotonic() + budget_s
        job = _Job(deadline, next(self._seq), text, fut)
        with self._cond:
            if budget_s is None:
                heapq.heappush(self._rest, (job.seq, job))
            else:
                heapq.heappush(self._live, job)
            self._cond.notify()
        return fut

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous batch call that bypasses the queue (offline evaluation, warm-up)."""
        return self.embedder.embed(texts)

    def pending(self) -> int:
        with self._cond:
            return len(self._live) + len(self._rest)

    def close(self) -> None:
        """Stop the worker after the pass it is running; jobs still queued are cancelled, not
        embedded (nobody waits for them at shutdown, and a backlog would hold the exit)."""
        with self._cond:
            jobs = [j for j in self._live] + [j for _, j in self._rest]
            self._live, self._rest = [], []
            self._stopping = True
            self._cond.notify_all()
        for job in jobs:
            job.future.cancel()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)

    def _pop(self) -> _Job | None:
        """The next job (the lock held): the earliest live deadline, else the oldest of the rest."""
        now = time.monotonic()
        while self._live:
            job = heapq.heappop(self._live)
            if job.deadline >= now:
                return job
            self.expired += 1
            heapq.heappush(self._rest, (job.seq, job))
        return heapq.heappop(self._rest)[1] if self._rest else None

    def _run(self) -> None:
        while True:
            with self._cond:
                first = self._pop()
                while first is None and not self._stopping:
                    self._cond.wait()
                    first = self._pop()
                if first is None:
                    return
            batch = [first]
            end = time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                with self._cond:
                    job = self._pop()
                    if job is None:
                        left = end - time.monotonic()
                        if left <= 0 or self._stopping:
                            break
                        self._cond.wait(left)
                        continue
                batch.append(job)
            self._embed_batch(batch)
            if self._stopping:
                return

    def _embed_batch(self, batch: list[_Job]) -> None:
        live = [j for j in batch if j.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            vecs = self.embedder.embed([j.text for j in live])
        except Exception as exc:  # handed to the callers, never kills the worker
            for j in live:
                j.future.set_exception(exc)
            return
        self.batches += 1
        self.items += len(live)
        for j, v in zip(live, vecs, strict=True):
            j.future.set_result(v)
