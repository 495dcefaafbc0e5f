"""One served model's share of the semantic predictor: its window index, its prompt-length priors,
its (optional) linear probe, refitted as the window moves, its ranking head (trained off the request
path, starting from the shipped prior) and its spread calibrator."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from sagegate.core.distribution import LengthDistribution
from sagegate.predictor.blend import Blend
from sagegate.predictor.calibration import SpreadCalibrator
from sagegate.predictor.history import Completion
from sagegate.predictor.index import WindowIndex
from sagegate.predictor.priors import WindowPriors
from sagegate.predictor.probe import LengthProbe
from sagegate.predictor.ranker import HeadModel, OnlineHead, features

if TYPE_CHECKING:
    from sagegate.predictor.semantic import SemanticConfig


class ModelShard:
    """One model's index, its length priors and (optional) linear probe."""

    def __init__(self, config: SemanticConfig, prior: HeadModel | None = None) -> None:
        self.priors = WindowPriors(
            config.bounds, min_samples=config.bucket_min_samples, max_points=config.max_points
        )
        self.index = WindowIndex(config.bounds, config.index, on_add=self._observe)
        self.probe = LengthProbe(config.probe_alpha)
        self.refit_every = config.probe_refit_every
        self.since_fit = 0
        self._fitting: threading.Thread | None = None
        self.head = OnlineHead(
            prior,
            max_rows=min(config.head_max_rows, config.bounds.max_entries),
            refit_every=config.head_refit_every,
            lam=config.head_lambda,
            pairwise_steps=config.head_pairwise_steps,
            background=config.index.background,
            max_age_s=config.bounds.max_age_s,
        )
        self.blend = Blend(config.head_weight, refit_every=50 if config.head_blend_learned else 10**12)
        self.calibrator = SpreadCalibrator(config.calibration_rate, target=config.coverage_target)

    def maybe_refit(self) -> None:
        """Refit the probe every ``refit_every`` additions or a tenth of the window, whichever is more
        (a fit costs O(window): ~6 s at 100k entries), on a thread unless replays are synchronous."""
        self.since_fit += 1
        if self.since_fit < max(self.refit_every, len(self.index) // 10):
            return
        if self._fitting is not None and self._fitting.is_alive():
            return
        self.since_fit = 0
        if not self.index.config.background:
            self._refit()
            return
        self._fitting = threading.Thread(target=self._refit, name="sagegate-probe-fit", daemon=True)
        self._fitting.start()

    def _refit(self) -> None:
        idx = self.index
        with idx.lock:
            snap = idx.lexical.snapshot()
            lengths = idx.out_tokens.copy()
        terms, rows, weights = idx.lexical.build(snap).expand()
        self.probe = LengthProbe(self.probe.alpha).fit(rows, terms, weights.astype(np.float32), lengths)

    def _observe(self, rec: Completion, now: float) -> None:
        self.priors.add(rec.ts, rec.prompt_tokens, rec.output_tokens, now)
        phi = features(rec.embedding, rec.cues, rec.prompt_tokens)
        self.head.observe(phi, rec.output_tokens, rec.ts, now)

    def observe_length(self, prompt_tokens: int, output_tokens: int, now: float) -> None:
        """An outcome without text: only the priors learn from it."""
        with self.index.lock:
            self.priors.add(now, prompt_tokens, output_tokens, now)

    def prior_for(self, prompt_tokens: int, now: float) -> tuple[LengthDistribution, str]:
        self.priors.expire(now)
        return self.priors.prior(prompt_tokens)
