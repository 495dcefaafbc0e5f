"""How far to move the neighbours toward the ranking head: a blend learned online per model.

Why: how much the head knows beside the neighbours differs by traffic (on ShareGPT with a warm window the
neighbours rank better than the head; on new traffic the head and its prior are all there is), so a fixed
weight is wrong somewhere. For each served prediction this remembers the neighbours' log-location ``a``
and the head's score ``h``; with the outcome ``y`` it refits ``y ≈ c + β_a·a + β_h·h`` by least squares
over the last ``window`` outcomes (damped toward the configured weight), and the served location is that
fit. Cheap: three numbers at predict time; the refit (a 3×3 solve) runs at most every ``refit_every``
outcomes, when the outcome is recorded, not when a request is predicted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

import numpy as np


class Blend:
    def __init__(
        self,
        weight: float,
        window: int = 2000,
        min_samples: int = 100,
        refit_every: int = 50,
        damp: float = 50.0,
    ) -> None:
        self.weight = weight
        self.min_samples = min_samples
        self.refit_every = refit_every
        self.damp = damp
        self._rows: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._pending: OrderedDict[int, tuple[object, float, float]] = OrderedDict()
        self._coef = np.array([0.0, 1.0 - weight, weight])
        self._since = 0
        self._lock = threading.Lock()

    @property
    def coef(self) -> np.ndarray:
        """(c, β_a, β_h) in use."""
        return self._coef

    def location(self, a: float, h: float, key: object | None = None) -> float:
        """The blended log-location for neighbours at ``a`` and head score ``h``."""
        if key is not None:
            with self._lock:
                self._pending[id(key)] = (key, a, h)
                while len(self._pending) > 4096:
                    self._pending.popitem(last=False)
        c = self._coef
        return float(c[0] + c[1] * a + c[2] * h)

    def observe(self, key: object, log_y: float) -> None:
        with self._lock:
            got = self._pending.pop(id(key), None)
            if got is None or got[0] is not key:
                return
            self._rows.append((got[1], got[2], log_y))
            self._since += 1
            if len(self._rows) < self.min_samples or self._since < self.refit_every:
                return
            self._since = 0
            rows = np.array(self._rows)
        x = np.column_stack([np.ones(len(rows)), rows[:, 0], rows[:, 1]])
        prior = np.array([0.0, 1.0 - self.weight, self.weight])
        reg = self.damp * np.diag([0.0, 1.0, 1.0])
        # intercept free; slopes damped toward the configured weight
        coef = np.linalg.solve(x.T @ x + reg, x.T @ rows[:, 2] + reg @ prior)
        if np.all(np.isfinite(coef)):
            self._coef = coef
