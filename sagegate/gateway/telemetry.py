"""What the dashboard shows over time: a rolling per-second timeline and recent prediction outcomes.

Nothing here is on a request's critical path beyond appending a number to a list: percentiles,
Kendall's tau and coverage are computed when the dashboard asks (at most once per feed build), and
counter deltas are read from the gateway's own Prometheus registry once per step by a background
task. Memory is bounded: ``window_s / step_s`` closed steps and ``recent`` prediction outcomes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry

from sagegate.core.distribution import LengthDistribution

WINDOW_S = 600.0
"""How far back the timeline reaches (ten minutes)."""
STEP_S = 1.0
"""The timeline's resolution."""
RECENT = 500
"""Completed requests kept for prediction quality (predicted against actual)."""
QUALITY_EVERY_S = 2.0
"""Prediction quality (an O(n²) tau over ``RECENT`` pairs, a few ms) is recomputed at most this often."""
MAX_PER_STEP = 2_000
"""Latency samples kept per step; beyond it a step's percentiles use the first ones (bounded memory
at any request rate)."""


@dataclass(slots=True)
class Step:
    """One closed step of the timeline."""

    t: float
    queue_depth: int
    admitted: float
    rejected: dict[str, float]
    ttft_p50: float | None
    ttft_p90: float | None
    ttlt_p50: float | None
    ttlt_p90: float | None


@dataclass(slots=True)
class Outcome:
    """A completed request's prediction and truth (None: it had no prediction)."""

    p10: float | None
    p50: float | None
    p90: float | None
    mean: float | None
    actual: int


@dataclass(slots=True)
class _Open:
    ttft: list[float] = field(default_factory=list)
    ttlt: list[float] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def counter_totals(registry: CollectorRegistry, wanted: dict[str, str]) -> dict[str, dict[str, float]]:
    """The ``_total`` samples of each counter in ``wanted`` (name → label), by that label's value, in
    one pass over the registry (a pass also runs the state collectors)."""
    out: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for metric in registry.collect():
        label = wanted.get(metric.name)
        if label is None:
            continue
        by = out[metric.name]
        for s in metric.samples:
            if s.name == f"{metric.name}_total":
                key = s.labels.get(label, "")
                by[key] = by.get(key, 0.0) + s.value
    return out


def tau_b(x: np.ndarray, y: np.ndarray) -> float | None:
    """Kendall's tau-b (ties corrected), by all pairs: O(n²) but vectorised, and n ≤ ``RECENT``
    keeps it to a few milliseconds. (scipy's would cost a second-long import on the event loop.)"""
    sx = np.sign(np.subtract.outer(x, x)).astype(np.int8)
    sy = np.sign(np.subtract.outer(y, y)).astype(np.int8)
    concordance = int(np.einsum("ij,ij->", sx, sy, dtype=np.int64))
    norm = math.sqrt(float(np.count_nonzero(sx)) * float(np.count_nonzero(sy)))
    return None if norm == 0 else concordance / norm


class Telemetry:
    """The gateway's recent history, for the dashboard."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        window_s: float = WINDOW_S,
        step_s: float = STEP_S,
        recent: int = RECENT,
    ) -> None:
        self.registry = registry
        self.step_s = step_s
        self.steps: deque[Step] = deque(maxlen=max(1, int(window_s / step_s)))
        self.outcomes: deque[Outcome] = deque(maxlen=recent)
        self._open = _Open()
        self._admitted = 0.0
        self._rejected: dict[str, float] = {}
        self._quality: tuple[float, dict[str, object]] | None = None

    # --- the request path: O(1) appends ---------------------------------------------------------
    def first_token(self, ttft_s: float) -> None:
        if len(self._open.ttft) < MAX_PER_STEP:
            self._open.ttft.append(ttft_s)

    def completed(self, ttlt_s: float, prediction: LengthDistribution | None, actual: int) -> None:
        if len(self._open.ttlt) < MAX_PER_STEP:
            self._open.ttlt.append(ttlt_s)
        if prediction is None:
            self.outcomes.append(Outcome(None, None, None, None, actual))
        else:
            self.outcomes.append(
                Outcome(
                    float(prediction.quantile(0.1)),
                    float(prediction.quantile(0.5)),
                    float(prediction.quantile(0.9)),
                    float(prediction.mean),
                    actual,
                )
            )

    # --- the sampler (a background task, once per step) -------------------------------------------
    def sample(self, now: float, queue_depth: int) -> Step:
        """Close the open step at ``now``: queue depth, counter deltas, latency percentiles."""
        totals = counter_totals(
            self.registry, {"sagegate_admissions": "backend", "sagegate_rejections": "reason"}
        )
        admitted = sum(totals["sagegate_admissions"].values())
        rejected = totals["sagegate_rejections"]
        step = Step(
            t=now,
            queue_depth=queue_depth,
            admitted=admitted - self._admitted,
            rejected={
                k: v - self._rejected.get(k, 0.0) for k, v in rejected.items() if v > self._rejected.get(k, 0)
            },
            ttft_p50=_pct(self._open.ttft, 50),
            ttft_p90=_pct(self._open.ttft, 90),
            ttlt_p50=_pct(self._open.ttlt, 50),
            ttlt_p90=_pct(self._open.ttlt, 90),
        )
        self._admitted, self._rejected = admitted, rejected
        self._open = _Open()
        self.steps.append(step)
        return step

    # --- what the dashboard reads -------------------------------------------------------------------
    def series(self) -> dict[str, object]:
        steps = list(self.steps)
        reasons = sorted({r for s in steps for r in s.rejected})
        return {
            "step_s": self.step_s,
            "t": [s.t for s in steps],
            "queue_depth": [s.queue_depth for s in steps],
            "admitted": [s.admitted for s in steps],
            "rejected": {r: [s.rejected.get(r, 0.0) for s in steps] for r in reasons},
            "ttft_p50": [s.ttft_p50 for s in steps],
            "ttft_p90": [s.ttft_p90 for s in steps],
            "ttlt_p50": [s.ttlt_p50 for s in steps],
            "ttlt_p90": [s.ttlt_p90 for s in steps],
        }

    def quality(self, now: float, points: int = 200) -> dict[str, object]:
        """Predicted against actual over the recent completions that had a prediction: Kendall's
        tau-b of predicted mean against actual, and how often the actual fell in the 10–90% band
        (the same answer for ``QUALITY_EVERY_S``)."""
        if self._quality is not None and now - self._quality[0] < QUALITY_EVERY_S:
            return self._quality[1]
        rows = [o for o in self.outcomes if o.mean is not None]
        tau: float | None = None
        coverage: float | None = None
        if len(rows) >= 2:
            tau = tau_b(np.array([o.mean for o in rows]), np.array([o.actual for o in rows], dtype=float))
        if rows:
            inside = sum(1 for o in rows if (o.p10 or 0.0) <= o.actual <= (o.p90 or 0.0))
            coverage = inside / len(rows)
        out: dict[str, object] = {
            "n": len(rows),
            "tau": tau,
            "coverage": coverage,
            "points": [[o.p50, o.p10, o.p90, o.actual] for o in rows[-points:]],
        }
        self._quality = (now, out)
        return out
