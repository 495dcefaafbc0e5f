"""The placement's forecast beside what happened (issue 64): how far off the first and last token were.

The forecast picker speaks in seconds of an assumed engine (``policies.engine_speed.EngineSpeed``); a
real backend is faster or slower by a factor of its own. So each backend's factor is learned from its
own past requests (the ratio of the seconds they took to the seconds forecast, both averaged with an
exponential weight), and each request is judged by its forecast times the factor as it stood before
its own outcome was known: an out-of-sample error, as llm-d reports its latency predictor's.

Pure and deterministic: the gateway feeds it at each request's end (``gateway.proxy``), a benchmark can
feed it simulated outcomes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from sagegate.policies.placement.outcome import Forecasted

WINDOW = 1000
"""Requests over which the median error is taken (the latest)."""
WEIGHT = 0.05
"""The weight of one request in a backend's factor (about the last 20 count)."""


@dataclass(slots=True)
class _Factor:
    """A backend's seconds per forecast second: exponentially weighted sums of both."""

    took: float = 0.0
    forecast: float = 0.0

    def value(self) -> float | None:
        return self.took / self.forecast if self.forecast > 0.0 else None

    def learn(self, took: float, forecast: float) -> None:
        self.took += WEIGHT * (took - self.took)
        self.forecast += WEIGHT * (forecast - self.forecast)


@dataclass(frozen=True, slots=True)
class Judged:
    """One request's forecast, in its backend's seconds after it was sent (None: no factor learned
    yet for that backend), and its relative error (None where the forecast is None)."""

    ttft_s: float | None
    ttlt_s: float | None
    ttft_error: float | None
    ttlt_error: float | None


@dataclass
class ForecastReport:
    """Learns each backend's factor and keeps the latest :data:`WINDOW` relative errors."""

    _ttft: dict[str, _Factor] = field(default_factory=dict)
    _ttlt: dict[str, _Factor] = field(default_factory=dict)
    ttft_errors: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    ttlt_errors: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def judge(self, backend: str, forecast: Forecasted, ttft_s: float | None, ttlt_s: float) -> Judged:
        """A request sent to ``backend`` with ``forecast`` took ``ttft_s`` to its first token (None:
        not seen) and ``ttlt_s`` to its last, both from when it was sent: its forecast and error as
        the factors stood, then the factors learn it."""
        first = self._ttft.setdefault(backend, _Factor())
        last = self._ttlt.setdefault(backend, _Factor())
        f_first, f_last = first.value(), last.value()
        ft = None if f_first is None else f_first * forecast.ttft_s
        fl = None if f_last is None else f_last * forecast.ttlt_s
        e_first = _error(ft, ttft_s)
        e_last = _error(fl, ttlt_s)
        if e_first is not None:
            self.ttft_errors.append(e_first)
        if e_last is not None:
            self.ttlt_errors.append(e_last)
        if ttft_s is not None and forecast.ttft_s > 0.0:
            first.learn(ttft_s, forecast.ttft_s)
        if forecast.ttlt_s > 0.0:
            last.learn(ttlt_s, forecast.ttlt_s)
        return Judged(ft, fl, e_first, e_last)

    def factors(self) -> dict[str, dict[str, float | None]]:
        """Each backend's learned seconds per forecast second, for its first token and its last."""
        return {b: {"ttft": f.value(), "ttlt": self._ttlt[b].value()} for b, f in self._ttft.items()}

    def median_errors(self) -> dict[str, float | None]:
        """The median relative error of the forecast over the latest requests (None: none yet)."""
        return {
            "ttft": median(self.ttft_errors) if self.ttft_errors else None,
            "ttlt": median(self.ttlt_errors) if self.ttlt_errors else None,
        }


def _error(forecast: float | None, took: float | None) -> float | None:
    """``|forecast − took| / took``; None when either is unknown or ``took`` is not positive."""
    if forecast is None or took is None or took <= 0.0:
        return None
    return abs(forecast - took) / took
