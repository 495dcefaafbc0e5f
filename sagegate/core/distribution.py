"""A discrete distribution over output length: the one type predictors return and policies read."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class LengthDistribution:
    """Support ``o_1 < … < o_n`` (tokens, each ≥ 1) with probabilities summing to one.

    Immutable; ``support`` and ``probs`` are plain tuples so small distributions stay cheap to build
    and to walk in pure Python (the Gittins rank loops over them).
    """

    support: tuple[int, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.support or len(self.support) != len(self.probs):
            raise ValueError("a distribution needs a non-empty support and one probability per point")

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def point(value: float) -> LengthDistribution:
        return LengthDistribution((max(1, round(value)),), (1.0,))

    @staticmethod
    def from_samples(
        samples: Iterable[float],
        weights: Iterable[float] | None = None,
        max_points: int | None = None,
    ) -> LengthDistribution:
        """Empirical distribution of ``samples`` (optionally weighted), merged onto at most
        ``max_points`` support points by weighted quantile buckets."""
        xs = np.maximum(1, np.rint(np.asarray(list(samples), dtype=float))).astype(np.int64)
        if xs.size == 0:
            raise ValueError("from_samples needs at least one sample")
        ws = np.ones(xs.size) if weights is None else np.asarray(list(weights), dtype=float)
        if ws.shape != xs.shape or np.any(ws < 0) or ws.sum() <= 0:
            raise ValueError("weights must be non-negative, one per sample, not all zero")
        values, inverse = np.unique(xs, return_inverse=True)
        mass = np.bincount(inverse, weights=ws)
        if max_points is not None and values.size > max_points:
            values, mass = _merge(values, mass, max_points)
        mass = mass / mass.sum()
        return LengthDistribution(tuple(int(v) for v in values), tuple(float(m) for m in mass))

    @staticmethod
    def from_histogram(hist: Mapping[float, float]) -> LengthDistribution:
        items = [(k, w) for k, w in hist.items() if w > 0]
        return LengthDistribution.from_samples([k for k, _ in items], [w for _, w in items])

    # --- summaries ----------------------------------------------------------------------------
    @property
    def mean(self) -> float:
        return math.fsum(map(operator.mul, self.support, self.probs))  # equal lengths: checked at build

    def quantile(self, q: float) -> int:
        """Smallest support point whose cumulative probability reaches ``q``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("quantile needs 0 <= q <= 1")
        acc = 0.0
        for o, p in zip(self.support, self.probs, strict=True):
            acc += p
            if acc >= q - 1e-12:
                return o
        return self.support[-1]

    def cdf(self, x: float) -> float:
        return math.fsum(p for o, p in zip(self.support, self.probs, strict=True) if o <= x)

    def summary(self) -> dict[str, float]:
        return {
            "mean": self.mean,
            "p10": float(self.quantile(0.1)),
            "p50": float(self.quantile(0.5)),
            "p90": float(self.quantile(0.9)),
            "points": float(len(self.support)),
        }

    def capped(self, max_tokens: int | None) -> LengthDistribution:
        """The distribution given a client's ``max_tokens``: the mass beyond it moves onto it."""
        if max_tokens is None or self.support[-1] <= max_tokens:
            return self
        support: list[int] = []
        probs: list[float] = []
        over = 0.0
        for o, p in zip(self.support, self.probs, strict=True):
            if o < max_tokens:
                support.append(o)
                probs.append(p)
            else:
                over += p
        support.append(max_tokens)
        probs.append(over)
        return LengthDistribution(tuple(support), tuple(probs))

    def to_json(self) -> dict[str, list[float]]:
        return {"support": list(self.support), "probs": list(self.probs)}


def _merge(values: np.ndarray, mass: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge sorted weighted points into ``max_points`` buckets of equal mass; each bucket keeps its
    weighted mean (rounded) as its support point."""
    cum = np.cumsum(mass) / mass.sum()
    bucket = np.minimum((cum * max_points - 1e-9).astype(np.int64), max_points - 1)
    bucket = np.maximum(bucket, 0)
    tot = np.bincount(bucket, weights=mass, minlength=max_points)
    wsum = np.bincount(bucket, weights=mass * values, minlength=max_points)
    keep = tot > 0
    merged = np.rint(wsum[keep] / tot[keep]).astype(np.int64)
    # Equal rounded means collapse into one point.
    uniq, inv = np.unique(merged, return_inverse=True)
    return uniq, np.bincount(inv, weights=tot[keep])


def mixture(parts: Sequence[tuple[float, LengthDistribution]]) -> LengthDistribution:
    """Weighted mixture of distributions (weights need not sum to one)."""
    xs: list[int] = []
    ws: list[float] = []
    for w, d in parts:
        if w <= 0:
            continue
        xs.extend(d.support)
        ws.extend(w * p for p in d.probs)
    return LengthDistribution.from_samples(xs, ws)


DEFAULT_PRIOR = LengthDistribution.point(256)
"""What a predictor answers before it has seen anything: a point at 256 tokens (a typical chat
answer). A point keeps cold-start ordering simple: equal predictions, so Gittins orders by prompt
length, and a request outliving 256 tokens is ranked by the past-support rule."""
