"""Output-length predictors that need no prompt text: the bounds and the floors of the study.

Every one is a :class:`core.predictor.InlinePredictor`: it answers ``predict_inline(req)`` once per
request (before it is queued) and hears ``observe_inline(req, true_output)`` when a request completes,
which is how the history-based ones learn.
All are deterministic: a predictor's answers depend only on its seed and on the sequence of calls
made to ``observe``, never on wall time or on the order in which ``predict`` is called.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Mapping, Sequence
from statistics import NormalDist

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution
from sagegate.core.predictor import InlinePredictor
from sagegate.core.request import PredictionQuery, truth_of


# --- oracles ----------------------------------------------------------------------------------
class OraclePredictor(InlinePredictor):
    """A point at the true output length (an upper bound on what prediction can give).

    A query carries no outcome, so an oracle is handed the run's answer key explicitly
    (:func:`core.request.answer_key`): only a simulation, which knows every outcome, can build one.
    """

    name: str = "oracle"

    def __init__(self, truth: Mapping[int, int]) -> None:
        self.truth = truth

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        return LengthDistribution.point(truth_of(self.truth, req))


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def unit_normal(seed: int, key: int) -> float:
    """A standard normal draw that is a pure function of ``(seed, key)`` (order-independent)."""
    return _draw(_splitmix64(seed & _MASK64), key)


def _draw(mixed_seed: int, key: int) -> float:
    """:func:`unit_normal` with its seed already mixed (a predictor mixes its own once)."""
    x = _splitmix64(mixed_seed ^ (key & _MASK64))
    u = ((x >> 11) + 0.5) / 9007199254740992.0  # 53 bits, strictly inside (0, 1)
    return _STD_NORMAL.inv_cdf(u)


_STD_NORMAL = NormalDist()


def lognormal_sigma(relative_error: float) -> float:
    """σ of the log-normal factor ``X`` with ``E[X] = 1`` and ``std(X) = relative_error``:
    ``σ² = ln(1 + r²)``."""
    if relative_error < 0:
        raise ValueError("relative_error must be >= 0")
    return math.sqrt(math.log1p(relative_error * relative_error))


def _unit_shape(sigma: float, points: int) -> tuple[tuple[float, ...], float]:
    """A mean-one log-normal(σ) discretised on ``points`` equal-probability points.

    The points are the normal's midpoint quantiles ``(k + ½)/points``, standardised to unit variance
    (midpoints alone under-state the spread: 0.191 instead of 0.2 at 16 points), exponentiated, then
    rescaled so the discrete mean is exactly one.
    """
    zs = [_STD_NORMAL.inv_cdf((k + 0.5) / points) for k in range(points)]
    spread = math.sqrt(math.fsum(z * z for z in zs) / points) or 1.0
    xs = [math.exp(sigma * z / spread) for z in zs]
    mean = math.fsum(xs) / points
    return tuple(x / mean for x in xs), 1.0 / points


class NoisyOraclePredictor(InlinePredictor):
    """The true length times log-normal noise of a given relative error (LSSP's sensitivity knob).

    *Relative error* ``r`` is the standard deviation of the ratio ``prediction / true``, whose mean
    is one: the factor is ``X = exp(σZ − σ²/2)`` with ``σ² = ln(1 + r²)`` (so ``r = 0.2`` gives
    ``σ ≈ 0.198``). ``Z`` is a pure function of ``(seed, rid)``: answers do not depend on call order.

    The answer is not a point: it is that same log-normal shape, discretised on ``points``
    equal-probability points and scaled so its mean is the noisy value, so a Gittins policy sees the
    uncertainty a real predictor of this accuracy would report. ``point=True`` returns the noisy
    value alone (what a point-prediction policy such as SSJF gets either way, via the mean).
    """

    name: str = "noisy-oracle"

    def __init__(
        self,
        relative_error: float = 0.2,
        seed: int = 0,
        *,
        truth: Mapping[int, int],
        points: int = 16,
        point: bool = False,
    ) -> None:
        if points < 1:
            raise ValueError("points must be >= 1")
        self.truth = truth
        self.relative_error = relative_error
        self.seed = seed
        self.point = point
        self.sigma = lognormal_sigma(relative_error)
        self._mixed_seed = _splitmix64(seed & _MASK64)
        self._shift = 0.5 * self.sigma * self.sigma
        self._shape, self._p = _unit_shape(self.sigma, points)
        self._probs = (self._p,) * points

    def noisy_value(self, req: PredictionQuery) -> float:
        """``true × X`` for this request (unrounded)."""
        z = _draw(self._mixed_seed, req.rid)
        return truth_of(self.truth, req) * math.exp(self.sigma * z - self._shift)

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        center = self.noisy_value(req)
        if self.point or self.sigma == 0.0:
            return LengthDistribution.point(center)
        support = [round(center * x) for x in self._shape]  # ascending
        if support[0] >= 1 and len(set(support)) == len(support):  # the common case: nothing merges
            return LengthDistribution(tuple(support), self._probs)
        support = []
        probs: list[float] = []
        p = self._p
        for x in self._shape:  # rounded values are non-decreasing: merge equal runs
            v = max(1, round(center * x))
            if support and support[-1] == v:
                probs[-1] += p
            else:
                support.append(v)
                probs.append(p)
        return LengthDistribution(tuple(support), tuple(probs))


# --- history ----------------------------------------------------------------------------------
class _Window:
    """The last ``size`` observed lengths and their empirical distribution, rebuilt lazily.

    Rebuilding costs O(size); to keep ``predict`` cheap, a cached distribution may lag by up to
    ``min(refresh_every − 1, len/16)`` observations, i.e. never more than 1/16 of the window's content
    (not at all below 16 samples, nor with ``refresh_every=1``). Deterministic in the observations.
    """

    __slots__ = ("_dist", "_stale", "max_points", "refresh_every", "samples")

    def __init__(self, size: int, max_points: int, refresh_every: int) -> None:
        if size < 1 or max_points < 1 or refresh_every < 1:
            raise ValueError("window, max_points and refresh_every must be >= 1")
        self.samples: deque[int] = deque(maxlen=size)
        self.max_points = max_points
        self.refresh_every = refresh_every
        self._dist: LengthDistribution | None = None
        self._stale = 0

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, output_tokens: int) -> None:
        self.samples.append(max(1, int(output_tokens)))
        self._stale += 1

    def dist(self) -> LengthDistribution:
        if self._dist is None or self._stale > min(self.refresh_every - 1, len(self.samples) // 16):
            self._dist = LengthDistribution.from_samples(self.samples, max_points=self.max_points)
            self._stale = 0
        return self._dist


class GlobalPredictor(InlinePredictor):
    """The empirical distribution of the last ``window`` completed outputs, whatever the prompt.

    Below ``min_samples`` observations it answers ``prior`` (default :data:`DEFAULT_PRIOR`).
    """

    name: str = "global"

    def __init__(
        self,
        window: int = 2000,
        max_points: int = 32,
        prior: LengthDistribution | None = None,
        *,
        min_samples: int = 1,
        refresh_every: int = 32,
    ) -> None:
        self.window = _Window(window, max_points, refresh_every)
        self.prior = DEFAULT_PRIOR if prior is None else prior
        self.min_samples = max(1, min_samples)

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        if len(self.window) < self.min_samples:
            return self.prior
        return self.window.dist()

    def observe_inline(self, req: PredictionQuery, output_tokens: int) -> None:
        self.window.add(output_tokens)


class LengthBucketPredictor(InlinePredictor):
    """Output-length history per prompt-length bucket (AIBrix-style), no prompt text needed.

    Buckets are powers of two by default (``[2^(k-1), 2^k)``, keyed by ``prompt_tokens.bit_length()``)
    or given as ascending upper edges ``buckets`` (bucket ``k`` holds ``edges[k-1] ≤ I < edges[k]``).
    A bucket with fewer than ``min_samples`` observations defers to a global window over all
    requests (itself answering ``prior`` when empty).
    """

    name: str = "length-bucket"

    def __init__(
        self,
        window_per_bucket: int = 500,
        buckets: Sequence[int] | None = None,
        min_samples: int = 8,
        max_points: int = 32,
        *,
        global_window: int = 2000,
        prior: LengthDistribution | None = None,
        refresh_every: int = 32,
    ) -> None:
        if buckets is not None and list(buckets) != sorted(set(buckets)):
            raise ValueError("bucket edges must be strictly ascending")
        self.edges = None if buckets is None else tuple(buckets)
        self.window_per_bucket = window_per_bucket
        self.min_samples = max(1, min_samples)
        self.max_points = max_points
        self.refresh_every = refresh_every
        self.fallback = GlobalPredictor(global_window, max_points, prior, refresh_every=refresh_every)
        self.windows: dict[int, _Window] = {}

    def bucket_of(self, prompt_tokens: int) -> int:
        if self.edges is None:
            return max(0, int(prompt_tokens)).bit_length()
        return bisect_right(self.edges, prompt_tokens)

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        w = self.windows.get(self.bucket_of(req.prompt_tokens))
        if w is None or len(w) < self.min_samples:
            return self.fallback.predict_inline(req)
        return w.dist()

    def observe_inline(self, req: PredictionQuery, output_tokens: int) -> None:
        key = self.bucket_of(req.prompt_tokens)
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = _Window(self.window_per_bucket, self.max_points, self.refresh_every)
        w.add(output_tokens)
        self.fallback.observe_inline(req, output_tokens)


# --- precomputed ------------------------------------------------------------------------------
class PrecomputedPredictor(InlinePredictor):
    """Distributions computed outside the simulation loop, keyed by the request's ``rid``.

    Unknown ids go to ``fallback`` (which also hears every observation); without one they raise
    ``KeyError``.
    """

    name: str = "precomputed"

    def __init__(
        self, dists: Mapping[int, LengthDistribution], fallback: InlinePredictor | None = None
    ) -> None:
        self.dists = dists
        self.fallback = fallback

    def predict_inline(self, req: PredictionQuery) -> LengthDistribution:
        d = self.dists.get(req.rid)
        if d is not None:
            return d
        if self.fallback is None:
            raise KeyError(f"no precomputed distribution for request {req.rid} and no fallback predictor")
        return self.fallback.predict_inline(req)

    def observe_inline(self, req: PredictionQuery, output_tokens: int) -> None:
        if self.fallback is not None:
            self.fallback.observe_inline(req, output_tokens)
