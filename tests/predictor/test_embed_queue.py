"""The embedding worker serves jobs that can still make their budget first: a job its caller gave up
on, or one nobody waits for (an outcome to record), waits until no live job does."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from sagegate.predictor.embed_queue import BatchingEmbedder


class _GatedEmbedder:
    """Records the order it embeds texts in; the first call waits until ``gate`` is set."""

    dim = 4

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.order: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not self.order:
            self.started.set()
            assert self.gate.wait(10)
        self.order.extend(texts)
        return np.ones((len(texts), self.dim), dtype=np.float32)


def test_live_deadlines_first_then_expired_and_unbudgeted_in_arrival_order() -> None:
    inner = _GatedEmbedder()
    q = BatchingEmbedder(inner, max_batch=1)
    try:
        busy = q.submit("busy")
        assert inner.started.wait(10)  # the worker is inside a pass
        jobs = [
            q.submit("record", None),
            q.submit("given up", 0.001),
            q.submit("later", 60.0),
            q.submit("sooner", 30.0),
        ]
        time.sleep(0.05)  # "given up" is past its deadline before the worker is free
        inner.gate.set()
        for f in [busy, *jobs]:
            f.result(10)
    finally:
        q.close()
    assert inner.order == ["busy", "sooner", "later", "record", "given up"]
    assert q.expired == 1 and q.items == 5


def test_without_budgets_jobs_keep_arrival_order_and_close_cancels_the_backlog() -> None:
    inner = _GatedEmbedder()
    q = BatchingEmbedder(inner, max_batch=1)
    first = q.submit("a")
    assert inner.started.wait(10)
    rest = [q.submit(t) for t in "bcd"]
    inner.gate.set()
    for f in rest:
        f.result(10)
    assert inner.order == ["a", "b", "c", "d"] and first.done()
    blocked = _GatedEmbedder()
    q2 = BatchingEmbedder(blocked)
    q2.submit("x")
    assert blocked.started.wait(10)
    queued = q2.submit("y", 1.0)
    threading.Timer(0.05, blocked.gate.set).start()
    q2.close()
    assert queued.cancelled()
    with pytest.raises(Exception):  # noqa: B017 - a cancelled future raises CancelledError
        queued.result(0)
    q.close()
