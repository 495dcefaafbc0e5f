"""A ranking head over a prompt's embedding and length cues, learned online from the gateway's history.

Why: the neighbours' vote ranks well where the window holds similar prompts and poorly where it does not
(new traffic); a linear model over the MiniLM embedding, the lexical cues of :mod:`predictor.cues` and
the prompt length generalises between neighbourhoods. Its score is in log-length units, so the semantic
predictor can move the neighbours' distribution by it, and a prior learned offline (the shipped weights,
:mod:`predictor.ranker_prior`) is a *shift* that transfers to another served model: online, each model
re-fits its own intercept and pulls the weights away from the prior as its completions arrive.

Training never runs in the request path: :class:`OnlineHead` keeps the last rows in compact arrays, and
every so often (geometrically at first: 16, 32, … completions, then every ``refit_every`` or a tenth of
the rows) fits on a background thread — ridge toward the prior's weights, then a few gradient steps of a
pairwise logistic (RankNet) loss — and swaps the new model in with one reference assignment. A
prediction is one dot product over ~410 numbers (microseconds).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from sagegate.predictor.cues import N_CUES

EMB_DIM = 384
N_FEATURES = EMB_DIM + N_CUES + 2


def features(embedding: np.ndarray, cues: np.ndarray, prompt_tokens: int) -> np.ndarray:
    """The head's input: embedding, cues (zeros when a record carries none), log prompt length and its
    square (scaled to unit range)."""
    lp = math.log(max(1, prompt_tokens)) / 10.0
    c = cues if cues.size == N_CUES else np.zeros(N_CUES, dtype=np.float32)
    return np.concatenate([embedding.astype(np.float32), c.astype(np.float32), [lp, lp * lp]])


@dataclass(frozen=True)
class HeadModel:
    """``score(φ) = bias + φ · coef``, already folded with the standardisation (``mu``, ``sd``) that
    ``coef_std`` was fitted under; ``sigma`` is the residual spread of log length around the score."""

    coef_std: np.ndarray
    intercept: float
    mu: np.ndarray
    sd: np.ndarray
    sigma: float
    fitted_on: int

    @property
    def coef(self) -> np.ndarray:
        return (self.coef_std / self.sd).astype(np.float32)

    @property
    def bias(self) -> float:
        return float(self.intercept - self.mu @ (self.coef_std / self.sd))

    def score(self, phi: np.ndarray) -> float:
        return self.bias + float(phi @ self.coef)


def fit_head(
    phi: np.ndarray,
    y: np.ndarray,
    prior: HeadModel | None = None,
    lam: float = 300.0,
    pairwise_steps: int = 60,
    pairs: int = 10000,
    seed: int = 0,
) -> HeadModel:
    """Fit on rows ``phi`` (n × N_FEATURES) and log lengths ``y``: ridge with the weights pulled toward
    the prior's (or zero) with strength ``lam``, then ``pairwise_steps`` of Adam on a RankNet loss over
    random pairs, held near the ridge solution; the score is re-scaled to log-length units at the end."""
    phi = phi.astype(np.float64)
    y = y.astype(np.float64)
    if prior is not None:
        mu, sd = prior.mu.astype(np.float64), prior.sd.astype(np.float64)
        w0 = prior.coef_std.astype(np.float64)
    else:
        mu, sd = phi.mean(axis=0), phi.std(axis=0) + 1e-3
        w0 = np.zeros(phi.shape[1])
    z = (phi - mu) / sd
    zm, ym = z.mean(axis=0), float(y.mean())
    zc, yc = z - zm, y - ym
    a = zc.T @ zc + lam * np.eye(z.shape[1])
    w = np.linalg.solve(a, zc.T @ yc + lam * w0)
    if pairwise_steps > 0 and y.size >= 32:
        w = _pairwise(zc, y, w, lam, pairwise_steps, pairs, seed)
    s = zc @ w
    var = float(s @ s)
    scale = float(s @ yc) / var if var > 0 else 1.0
    w = w * max(scale, 0.0) if scale > 0 else w
    resid = yc - zc @ w
    sigma = float(np.sqrt(np.mean(resid**2))) if y.size > 1 else 1.0
    return HeadModel(
        w.astype(np.float32),
        ym - float(zm @ w),
        mu.astype(np.float32),
        sd.astype(np.float32),
        max(sigma, 0.05),
        int(y.size),
    )


def _pairwise(
    z: np.ndarray, y: np.ndarray, w: np.ndarray, lam: float, steps: int, pairs: int, seed: int
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = y.size
    i, j = rng.integers(0, n, pairs), rng.integers(0, n, pairs)
    sign = np.sign(y[i] - y[j])
    keep = np.abs(y[i] - y[j]) > 0.1
    i, j, sign = i[keep], j[keep], sign[keep]
    if not i.size:
        return w
    dz = z[i] - z[j]
    anchor, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
    lr, b1, b2 = 0.01, 0.9, 0.999
    for t in range(1, steps + 1):
        margin = sign * (dz @ w)
        g_pair = -(sign / (1.0 + np.exp(np.clip(margin, -30, 30))))
        grad = dz.T @ g_pair / i.size + (lam / n) * (w - anchor)
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + 1e-8)
    return w


class OnlineHead:
    """One served model's head: the last ``max_rows`` completions as training rows, a model fitted off
    the request path, and the prior it starts from (and is pulled toward)."""

    FIRST_FITS = (16, 32, 64, 128, 256)

    def __init__(
        self,
        prior: HeadModel | None = None,
        max_rows: int = 20000,
        refit_every: int = 500,
        lam: float = 300.0,
        pairwise_steps: int = 60,
        background: bool = True,
        max_age_s: float = math.inf,
    ) -> None:
        self.prior = prior
        self.max_age_s = max_age_s
        self.model: HeadModel | None = None
        self.max_rows = max_rows
        self.refit_every = refit_every
        self.lam = lam
        self.pairwise_steps = pairwise_steps
        self.background = background
        self._phi = np.zeros((0, N_FEATURES), dtype=np.float32)
        self._y = np.zeros(0, dtype=np.float32)
        self._ts = np.zeros(0, dtype=np.float64)
        self._now = -math.inf
        self._n = 0
        self._ysum = 0.0
        self._since = 0
        self._lock = threading.Lock()
        self._fitting: threading.Thread | None = None
        self.fits = 0
        self.fit_threads: set[str] = set()

    def __len__(self) -> int:
        return min(self._n, self.max_rows)

    def score(self, phi: np.ndarray) -> float | None:
        """The fitted model's score; before the first fit the prior's *shift* added to this model's mean
        log length so far (the prior's own intercept, another model's scale, only with no outcome yet);
        None without either."""
        if self.model is not None:
            return self.model.score(phi)
        if self.prior is None:
            return None
        base = self._ysum / self._n if self._n else self.prior.intercept
        return self.prior.score(phi) - self.prior.intercept + base

    @property
    def sigma(self) -> float:
        model = self.model if self.model is not None else self.prior
        return 1.0 if model is None else model.sigma

    def observe(self, phi: np.ndarray, output_tokens: int, ts: float = 0.0, now: float = 0.0) -> None:
        """One completion: a training row, and a fit when the schedule says so (never inline unless
        ``background`` is off, as in replays). Rows older than ``max_age_s`` at fit time are left out,
        as the window's expired entries are."""
        with self._lock:
            if self._phi.shape[0] < self.max_rows and self._n >= self._phi.shape[0]:
                size = min(self.max_rows, max(256, 2 * self._phi.shape[0]))
                self._phi = np.concatenate(
                    [self._phi, np.zeros((size - self._phi.shape[0], N_FEATURES), np.float32)]
                )
                self._y = np.concatenate([self._y, np.zeros(size - self._y.size, np.float32)])
                self._ts = np.concatenate([self._ts, np.zeros(size - self._ts.size, np.float64)])
            at = self._n % self.max_rows
            self._phi[at] = phi
            self._y[at] = math.log(max(1, output_tokens))
            self._ts[at] = ts
            self._now = max(self._now, now)
            self._n += 1
            self._ysum += float(self._y[at])
            self._since += 1
            due = self._n in self.FIRST_FITS or self._since >= max(self.refit_every, len(self) // 10)
        if due:
            self.maybe_fit()

    def maybe_fit(self) -> None:
        if self._fitting is not None and self._fitting.is_alive():
            return
        self._since = 0
        if not self.background:
            self.fit_now()
            return
        self._fitting = threading.Thread(target=self.fit_now, name="sagegate-head-fit", daemon=True)
        self._fitting.start()

    def fit_now(self) -> None:
        with self._lock:
            n = len(self)
            live = self._ts[:n] >= self._now - self.max_age_s
            phi, y = self._phi[:n][live], self._y[:n][live]
            n = int(live.sum())
        if n < self.FIRST_FITS[0]:
            return
        self.fit_threads.add(threading.current_thread().name)
        self.model = fit_head(phi, y, self.prior, self.lam, self.pairwise_steps, seed=self.fits)
        self.fits += 1

    def wait(self, timeout: float = 30.0) -> None:
        t = self._fitting
        if t is not None:
            t.join(timeout)


def log_mean(support: np.ndarray, weights: np.ndarray) -> float:
    """Weighted mean of log length (what the head's score estimates)."""
    return float(weights @ np.log(np.maximum(support, 1.0)) / weights.sum())


def lognormal_points(log_median: float, sigma: float, points: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A discretised log-normal (equal-mass quantile points): the head's own answer when no neighbours
    or priors exist yet."""
    from scipy.special import ndtri

    q = (np.arange(points) + 0.5) / points
    return np.exp(log_median + sigma * ndtri(q)), np.full(points, 1.0 / points)
