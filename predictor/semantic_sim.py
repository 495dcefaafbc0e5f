"""The semantic core on the simulator's face: a :class:`core.predictor.LengthPredictor`.

The simulator asks about a request before it is queued and reports its outcome when it completes;
a request's features are computed once (or ahead, in batches: :meth:`SemanticLengthPredictor.prime`)
and kept by ``rid`` between the two calls.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from core.distribution import LengthDistribution
from core.request import PredictionQuery, TraceRequest
from predictor.semantic import PromptFeatures, SemanticPredictor

MAX_CACHED = 100_000
"""Features kept for requests asked about but not yet completed (oldest dropped first)."""


class SemanticLengthPredictor:
    """``predict(query)`` / ``observe(query, output_tokens)`` over a :class:`SemanticPredictor`."""

    name = "semantic"

    def __init__(self, core: SemanticPredictor) -> None:
        self.core = core
        self._features: OrderedDict[int, PromptFeatures | None] = OrderedDict()

    def predict(self, req: PredictionQuery) -> LengthDistribution:
        feats = self._features_of(req)
        model = req.model or self.core.default_model
        return self.core.predict_features(feats, req.prompt_tokens, model).distribution

    def observe(self, req: PredictionQuery, output_tokens: int) -> None:
        feats = self._features_of(req)
        self._features.pop(req.rid, None)
        model = req.model or self.core.default_model
        if feats is None:  # no text: only the priors learn
            self.core.record_length(req.prompt_tokens, output_tokens, model)
            return
        self.core.record_features(
            feats, req.prompt_tokens, output_tokens, model, req.tenant, rid=f"sim-{req.rid}"
        )

    def prime(self, requests: Iterable[TraceRequest], batch: int = 64) -> None:
        """Embed a workload's prompts ahead, in batches (a simulator calling ``predict`` one request at
        a time would otherwise pay one forward pass each)."""
        todo = [r for r in requests if r.prompt and r.rid not in self._features]
        for i in range(0, len(todo), batch):
            chunk = todo[i : i + batch]
            for req, feats in zip(
                chunk, self.core.features_many([r.prompt or "" for r in chunk]), strict=True
            ):
                self._features[req.rid] = feats

    def _features_of(self, req: PredictionQuery) -> PromptFeatures | None:
        if req.rid in self._features:
            return self._features[req.rid]
        feats = None if not req.prompt else self.core.features(req.prompt)
        self._features[req.rid] = feats
        while len(self._features) > MAX_CACHED:
            self._features.popitem(last=False)
        return feats
