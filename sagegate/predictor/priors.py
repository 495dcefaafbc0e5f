"""The fallback priors of the semantic predictor, kept over the same live window as its index.

Like :class:`predictor.baselines.LengthBucketPredictor` (power-of-two prompt-length buckets, the last
``per_bucket`` outputs of a bucket, else the last ``global_window`` outputs of all), but bounded by the
window's count and age too, so an expired length stops shaping the prior exactly when it stops being a
neighbour. Lengths sit in compact numpy columns (16 bytes an entry); distributions are cached and rebuilt
after a sixteenth of the window has changed.
"""

from __future__ import annotations

import numpy as np

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution
from sagegate.predictor.history import WindowBounds


class WindowPriors:
    def __init__(
        self,
        bounds: WindowBounds,
        per_bucket: int = 500,
        global_window: int = 2000,
        min_samples: int = 8,
        max_points: int = 32,
    ) -> None:
        self.bounds = bounds
        self.per_bucket = per_bucket
        self.global_window = global_window
        self.min_samples = min_samples
        self.max_points = max_points
        self._ts = np.zeros(64, dtype=np.float64)
        self._bucket = np.zeros(64, dtype=np.int32)
        self._out = np.zeros(64, dtype=np.int32)
        self._start = 0
        self._end = 0
        self._changes = 0
        self._cache: dict[int, LengthDistribution | None] = {}

    def __len__(self) -> int:
        return self._end - self._start

    @staticmethod
    def bucket_of(prompt_tokens: int) -> int:
        return max(0, int(prompt_tokens)).bit_length()

    def add(self, ts: float, prompt_tokens: int, output_tokens: int, now: float) -> None:
        if self._end == self._ts.size:
            self._make_room()
        self._ts[self._end] = ts
        self._bucket[self._end] = self.bucket_of(prompt_tokens)
        self._out[self._end] = max(1, int(output_tokens))
        self._end += 1
        self._changes += 1
        self.expire(now)

    def expire(self, now: float) -> None:
        horizon = self.bounds.horizon(now)
        start = max(self._start, self._end - self.bounds.max_entries)
        while start < self._end and self._ts[start] < horizon:
            start += 1
        if start != self._start:
            self._changes += start - self._start
            self._start = start

    def _make_room(self) -> None:
        live = slice(self._start, self._end)
        n = self._end - self._start
        size = self._ts.size if n < self._ts.size // 2 else 2 * self._ts.size
        for name in ("_ts", "_bucket", "_out"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[:n] = old[live]
            setattr(self, name, new)
        self._start, self._end = 0, n

    def prior(self, prompt_tokens: int) -> tuple[LengthDistribution, str]:
        """The bucket's distribution if it has ``min_samples`` outputs, else the global one if the
        window holds ``min_samples``, else the cold default; and the path name."""
        if self._changes > len(self) // 16:
            self._cache.clear()
            self._changes = 0
        b = self.bucket_of(prompt_tokens)
        if b not in self._cache:
            outs = self._out[self._start : self._end][self._bucket[self._start : self._end] == b]
            self._cache[b] = self._dist(outs[-self.per_bucket :]) if outs.size >= self.min_samples else None
        dist = self._cache[b]
        if dist is not None:
            return dist, "bucket"
        if -1 not in self._cache:
            outs = self._out[self._start : self._end][-self.global_window :]
            # As for a bucket: a handful of outcomes (a client's one warm-up request) is no prior.
            self._cache[-1] = self._dist(outs) if outs.size >= self.min_samples else None
        dist = self._cache[-1]
        return (dist, "global") if dist is not None else (DEFAULT_PRIOR, "cold")

    def _dist(self, outs: np.ndarray) -> LengthDistribution:
        return LengthDistribution.from_samples(outs, max_points=self.max_points)
