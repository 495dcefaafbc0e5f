"""How fast an engine goes, as the ``forecast`` placement reads it, and how that is learned from the
engine's own counters while it serves.

:class:`EngineSpeed` is three numbers: a prefill token's time, and a decode step's time at a batch of
``n`` (``step_s + per_seq_s · n``). :class:`SpeedFit` learns them for one backend: every interval
between two scrapes in which the engine was busy throughout gives one equation

    seconds = prefill_s · P + step_s · S + per_seq_s · G

with ``P`` the prompt tokens it computed (prompt tokens less prefix-cache hits), ``G`` the tokens it
generated and ``S = G / n`` the decode steps at the mean batch ``n`` over the interval. Recursive
least squares with forgetting, started from a prior speed worth ``prior_weight`` intervals, so a
backend is placed by the prior until it has shown its own speed and by its own after. Pure
arithmetic: the gateway feeds it scrapes, a test feeds it an engine model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpeed:
    """An engine's speed. The defaults are a Llama-3.1-8B on an H100 as the simulator's engine model
    has it (``sim.perf``: prefill of 1-8k tokens, decode at batches 1-64 of 4,000 tokens of context
    each, least squares; ``harness.simtwin.engine_speed``)."""

    prefill_s: float = 2.6e-5
    step_s: float = 0.0062
    per_seq_s: float = 0.00019

    def decode_s(self, tokens: float, batch: int) -> float:
        return tokens * (self.step_s + self.per_seq_s * batch)


FLOOR = (1e-8, 1e-5, 0.0)
"""Smallest believable ``prefill_s``, ``step_s``, ``per_seq_s``: a fit below is clamped (a noisy
interval must not make an engine look free)."""


class SpeedFit:
    """One backend's :class:`EngineSpeed`, learned online (module docstring)."""

    __slots__ = ("_p", "_theta", "forget", "intervals")

    def __init__(self, prior: EngineSpeed, prior_weight: float = 2.0, forget: float = 0.995) -> None:
        self.forget = forget
        self._theta = [prior.prefill_s, prior.step_s, prior.per_seq_s]
        # the prior's covariance: each coefficient known to about its own size over prior_weight
        # intervals of typical work (a 2,000-token prefill, 20 steps of a batch of 16)
        scale = (2000.0, 20.0, 320.0)
        self._p = [[0.0] * 3 for _ in range(3)]
        for k in range(3):
            self._p[k][k] = 1.0 / (prior_weight * scale[k] * scale[k])
        self.intervals = 0
        """Busy intervals learned from."""

    @property
    def speed(self) -> EngineSpeed:
        a, b, c = (max(lo, v) for lo, v in zip(FLOOR, self._theta, strict=True))
        return EngineSpeed(a, b, c)

    def observe(self, seconds: float, prefilled: float, generated: float, batch: float) -> None:
        """One busy interval: ``seconds`` long, ``prefilled`` prompt tokens computed, ``generated``
        tokens decoded at a mean batch of ``batch`` requests."""
        if seconds <= 0.0 or batch <= 0.0 or (prefilled <= 0.0 and generated <= 0.0):
            return
        x = (prefilled, generated / batch, generated)
        p = self._p
        px = [sum(p[i][j] * x[j] for j in range(3)) for i in range(3)]
        denom = self.forget + sum(x[i] * px[i] for i in range(3))
        gain = [v / denom for v in px]
        err = seconds - sum(self._theta[i] * x[i] for i in range(3))
        self._theta = [self._theta[i] + gain[i] * err for i in range(3)]
        self._p = [[(p[i][j] - gain[i] * px[j]) / self.forget for j in range(3)] for i in range(3)]
        self.intervals += 1
