"""Calibration: each window's knee ``λ_ref`` and the utilisation each operating region implies.

``λ_ref`` is the arrival compression factor at which the reference configuration — ``fcfs`` at engine
level on one H100 running Llama-3.1-8B, i.e. vLLM alone — reaches a 0.5% deadline-violation rate,
found by bisection over log10(factor) in [−2, 4] in 30 steps (docs/design/study.md). Compressing arrivals by a
factor also divides each deadline's slack by it.

Utilisation of a region = offered request rate / the engine's saturated request rate for the
window's own mix. The saturated rate is measured, not modelled: the window's requests are replayed
``copies`` times over, all arriving at once, and the rate is the number of completions between the
20th and 80th percentile completion times divided by that interval — the steady state of a full
engine, without the start-up and the tail of the last long requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from sagegate.core.request import TraceRequest
from sagegate.study.config import RegionAnchor, StudyConfig
from sagegate.study.simrun import Entry, run_window
from sagegate.study.windows import Window


@dataclass(frozen=True)
class Knee:
    """Bisection result: ``log10_factor`` of the knee; ``censored`` is ``"low"`` when even the
    smallest factor violates, ``"high"`` when even the largest does not, else ``""``."""

    log10_factor: float
    censored: str
    evaluations: int


def find_knee(
    violation_at: Callable[[float], float], target: float, lo: float, hi: float, steps: int
) -> Knee:
    """Smallest log10(factor) in ``[lo, hi]`` whose violation rate reaches ``target``, by bisection.

    Keeps ``violation_at(10**hi) ≥ target`` and ``violation_at(10**lo) < target`` as the invariant
    (assumed, not evaluated, at the bounds) and returns ``hi`` after ``steps`` halvings.
    """
    if not lo < hi or steps < 1:
        raise ValueError("need lo < hi and steps >= 1")
    a, b = lo, hi
    moved_lo = moved_hi = False
    for _ in range(steps):
        mid = 0.5 * (a + b)
        if violation_at(10.0**mid) >= target:
            b, moved_hi = mid, True
        else:
            a, moved_lo = mid, True
    censored = "" if moved_lo and moved_hi else ("low" if not moved_lo else "high")
    return Knee(b, censored, steps)


@dataclass(frozen=True)
class Calibration:
    """One window's knee and load scale."""

    window: str
    lambda_ref: float
    log10_ref: float
    censored: str
    evaluations: int
    arrival_rate: float
    """Requests per second of the window as traced (factor 1)."""
    saturated_rate: float
    """Requests per second the reference engine sustains on this window's mix."""

    def utilisation(self, factor: float) -> float:
        return factor * self.arrival_rate / self.saturated_rate if self.saturated_rate > 0 else math.nan

    def factor(self, anchor: RegionAnchor, multiple: float) -> float:
        """The arrival compression factor of a region: ``multiple`` × λ_ref (violation-anchored) or
        the factor whose offered rate is ``multiple`` × the saturated rate (utilisation-anchored)."""
        if anchor is RegionAnchor.VIOLATION:
            return multiple * self.lambda_ref
        if not (self.saturated_rate > 0 and math.isfinite(self.saturated_rate) and self.arrival_rate > 0):
            raise ValueError(f"window {self.window}: no finite saturated rate to anchor a utilisation on")
        return multiple * self.saturated_rate / self.arrival_rate

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def violation_rate(requests: Sequence[TraceRequest], factor: float, cfg: StudyConfig, seed: int) -> float:
    """The reference configuration's deadline-violation rate at ``factor``."""
    res = run_window(
        requests, factor, Entry(cfg.calibration_policy, "engine"), model=cfg.model, gpu=cfg.gpu, seed=seed
    )
    late = sum(1 for r in res.records if r.finish_s is None or r.finish_s > (r.deadline_s or math.inf))
    return late / len(res.records)


def saturated_rate(requests: Sequence[TraceRequest], cfg: StudyConfig, seed: int, copies: int = 5) -> float:
    """Steady-state completions per second with ``copies`` × the window all arriving at once."""
    burst = [
        replace(r, rid=k * len(requests) + r.rid, arrival_s=0.0, deadline_s=None)
        for k in range(copies)
        for r in requests
    ]
    res = run_window(
        burst, 1.0, Entry(cfg.calibration_policy, "engine"), model=cfg.model, gpu=cfg.gpu, seed=seed
    )
    finish = np.sort([r.finish_s for r in res.records if r.finish_s is not None])
    if len(finish) < 5:
        return math.nan
    t20, t80 = np.percentile(finish, [20, 80])
    n = int(((finish > t20) & (finish <= t80)).sum())
    return n / float(t80 - t20) if t80 > t20 else math.inf


def arrival_rate(requests: Sequence[TraceRequest]) -> float:
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    return (len(requests) - 1) / span if span > 0 else math.inf


def calibrate_window(window: Window, cfg: StudyConfig) -> Calibration:
    """Bisection for ``λ_ref`` (30 simulations of the window) plus the saturated rate (one of five
    times its size)."""
    reqs = window.requests
    knee = find_knee(
        lambda f: violation_rate(reqs, f, cfg, window.seed),
        cfg.target_violation,
        cfg.bisect_lo,
        cfg.bisect_hi,
        cfg.bisect_steps,
    )
    return Calibration(
        window=window.id,
        lambda_ref=10.0**knee.log10_factor,
        log10_ref=knee.log10_factor,
        censored=knee.censored,
        evaluations=knee.evaluations,
        arrival_rate=arrival_rate(reqs),
        saturated_rate=saturated_rate(reqs, cfg, window.seed),
    )
