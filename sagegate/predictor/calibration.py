"""Conformal spread correction: keep the predicted 10–90% interval covering ~80% of recent outcomes.

Why: blending neighbours, priors and the ranking head moves each distribution's location, and its spread
drifts from the truth in either direction (too wide right after a cold start, too narrow once neighbours
agree). Every distribution is stretched in log space around its median by one factor ``g`` and then
rescaled so that its *mean is unchanged* (rankings by mean, what Kendall's tau and the scheduler's
order read, do not move). ``g`` follows adaptive conformal inference (Gibbs & Candès, 2021): after
each outcome, ``log g += rate · (miss − (1 − target))``, where ``miss`` says the outcome fell outside
the interval that was served. On a stream whose location is right, the long-run share of misses tends
to ``1 − target``; on one whose location is biased (outcomes ~1.7× the predicted median) widening
around a kept mean cannot cover them, ``g`` runs to ``MAX_FACTOR`` and the median collapses, so it is
opt-in (``SemanticConfig.calibrate``).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from sagegate.core.distribution import LengthDistribution

MIN_FACTOR, MAX_FACTOR = 0.05, 6.0


class SpreadCalibrator:
    def __init__(self, rate: float = 0.05, target: float = 0.8, pending: int = 4096) -> None:
        self.rate = rate
        self.target = target
        self._log_g = 0.0
        self._pending: OrderedDict[int, tuple[object, int, int]] = OrderedDict()
        self._max_pending = pending
        self._lock = threading.Lock()

    @property
    def factor(self) -> float:
        return math.exp(self._log_g)

    def apply(self, dist: LengthDistribution, key: object | None = None) -> LengthDistribution:
        """The stretched, mean-preserving distribution; with ``key`` (the prompt's features), the served
        interval is remembered so that :meth:`observe` with the same key can score it."""
        out = stretch(dist, self.factor)
        if key is not None:
            with self._lock:
                self._pending[id(key)] = (key, out.quantile(0.1), out.quantile(0.9))
                while len(self._pending) > self._max_pending:
                    self._pending.popitem(last=False)
        return out

    def observe(self, key: object, output_tokens: int) -> None:
        """The outcome of the prediction served under ``key`` (ignored when none was remembered)."""
        with self._lock:
            got = self._pending.pop(id(key), None)
            if got is None or got[0] is not key:
                return
            miss = not (got[1] <= output_tokens <= got[2])
            step = self.rate * (float(miss) - (1.0 - self.target))
            self._log_g = min(max(self._log_g + step, math.log(MIN_FACTOR)), math.log(MAX_FACTOR))


def stretch(dist: LengthDistribution, g: float) -> LengthDistribution:
    """``dist`` with log-deviations from its median multiplied by ``g``, then rescaled to its mean."""
    if abs(g - 1.0) < 1e-6 or len(dist.support) < 2:
        return dist
    sup = np.asarray(dist.support, dtype=float)
    probs = np.asarray(dist.probs, dtype=float)
    med = float(dist.quantile(0.5))
    new = med * np.exp(np.clip(g * np.log(sup / med), -12.0, 12.0))
    new *= float(probs @ sup) / float(probs @ new)
    return LengthDistribution.from_samples(new, probs)
