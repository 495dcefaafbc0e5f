"""The semantic core behind the one predictor interface (:class:`core.predictor.LengthPredictor`).

How a prompt's features (its embedding, terms and cues) are computed is chosen when it is built:

* ``budget_s=None`` (the simulator, replays): on the calling thread, or ahead in batches
  (:meth:`SemanticLengthPredictor.prime`), so nothing waits and a replay is the same run every time;
* ``budget_s=b`` (the gateway): on the embedder's worker thread, off the event loop. A prediction
  waits at most ``b`` for them; past that the request is ranked from the prompt-length prior at once
  (path ``late``) and the answer they give follows (``Prediction.later``).

Either way the features travel as the prediction's memo, so an outcome is learnt under the embedding
its prediction used, computed once; on the worker, a prompt seen lately (a client's retry, a batch
job's repeated prompt) is not embedded again (:data:`RECENT_PROMPTS`). A query without text (token
ids; a trace without prompts) is answered from the prompt-length prior (path ``no_text``) and its
outcome teaches only that prior.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from concurrent.futures import Future

import numpy as np

from sagegate.core.distribution import LengthDistribution
from sagegate.core.lru import Lru
from sagegate.core.outcomes import PredictionPath
from sagegate.core.predictor import Prediction
from sagegate.core.request import PredictionQuery, TraceRequest
from sagegate.predictor.semantic import PromptFeatures, SemanticPredictor

Vector = Future[np.ndarray]

RECENT_PROMPTS = 4096
"""Prompts whose features the gateway keeps, most recently asked first (~3 KB each): an exact repeat
among them is answered without an embedding."""


class SemanticLengthPredictor:
    """The semantic predictor: ``predict`` / ``observe`` over a :class:`SemanticPredictor` core."""

    name = "semantic"

    def __init__(self, core: SemanticPredictor, budget_s: float | None = None) -> None:
        self.core = core
        self.budget_s = budget_s
        """None: features on the calling thread (never waits); else the longest wait for the worker's."""
        self._primed: dict[int, PromptFeatures] = {}
        self._recent: Lru[bytes, PromptFeatures] = Lru(RECENT_PROMPTS)
        """Recent prompts' features by a digest of their text (a chat's history may be long)."""
        self.repeats = 0
        """Predictions answered from :attr:`_recent` (an exact repeat: no embedding)."""

    # --- the interface ------------------------------------------------------------------------
    async def predict(self, query: PredictionQuery) -> Prediction:
        model = query.model or self.core.default_model
        if not query.prompt:
            answer = self.core.predict_features(None, query.prompt_tokens, model)
            return Prediction(answer.distribution, PredictionPath.NO_TEXT)
        if self.budget_s is None:
            feats = self._inline_features(query.rid, query.prompt)
        else:
            budget = self.budget_s if query.wait_s is None else min(self.budget_s, query.wait_s)
            ready = await self._features_within_budget(query.prompt, budget)
            if not isinstance(ready, PromptFeatures):
                return self._without_features(query, model, ready)
            feats = ready
        answer = self.core.predict_features(feats, query.prompt_tokens, model)
        return Prediction(answer.distribution, answer.path, memo=feats)

    async def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        model = query.model or self.core.default_model
        if not query.prompt:
            self.core.record_length(query.prompt_tokens, output_tokens, model)
            return
        if self.budget_s is None:
            feats = (
                memo if isinstance(memo, PromptFeatures) else self._inline_features(query.rid, query.prompt)
            )
            rid = f"sim-{query.rid}"  # a replay's records are named by its request ids
            self.core.record_features(feats, query.prompt_tokens, output_tokens, model, query.tenant, rid=rid)
            return
        try:
            feats = await self._recorded_features(query.prompt, memo)
            self.core.record_features(feats, query.prompt_tokens, output_tokens, model, query.tenant)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.core.failed("recording a completion failed")

    async def start(self) -> None:
        """Read the history window (Redis I/O), then load the model, so no request waits for either."""
        if self.budget_s is None:
            self.core.start()
            return
        await asyncio.to_thread(self.core.start)
        await asyncio.to_thread(self.core.warm_up)

    async def close(self) -> None:
        await asyncio.to_thread(self.core.close)

    # --- features ahead (replays) -------------------------------------------------------------
    def prime(self, requests: Iterable[TraceRequest], batch: int = 64) -> None:
        """Embed a workload's prompts ahead, in batches (one forward pass per request otherwise)."""
        todo = [r for r in requests if r.prompt and r.rid not in self._primed]
        for i in range(0, len(todo), batch):
            chunk = todo[i : i + batch]
            for req, feats in zip(
                chunk, self.core.features_many([r.prompt or "" for r in chunk]), strict=True
            ):
                self._primed[req.rid] = feats

    def _inline_features(self, rid: int, prompt: str) -> PromptFeatures:
        primed = self._primed.pop(rid, None)
        return primed if primed is not None else self.core.features(prompt)

    # --- features on the worker (the gateway) -------------------------------------------------
    def _submit(
        self, text: str, budget_s: float | None, key: bytes | None = None
    ) -> tuple[asyncio.Future[PromptFeatures], Vector]:
        """The prompt's features, embedded on the worker thread (and the worker's own future of the
        vector); ``budget_s`` (how long the caller will wait) lets the worker serve jobs that can
        still make it first (``predictor.embed_queue``). ``key``: the text's digest, when the caller
        has it; the features are remembered under it."""
        vec = self.core.embedder.submit(text, budget_s)
        remembered = _digest(text) if key is None else key

        async def resolve() -> PromptFeatures:
            feats = self.core.features_from(await asyncio.wrap_future(vec), text)
            self._remember(remembered, feats)
            return feats

        return asyncio.ensure_future(resolve()), vec

    async def _features_within_budget(
        self, text: str, budget_s: float
    ) -> PromptFeatures | asyncio.Future[PromptFeatures] | BaseException:
        """The features if they come within the budget; else the task still computing them; else
        what the embedder raised."""
        key = _digest(text)
        known = self._recent.get(key)
        if known is not None:
            self.repeats += 1
            return known
        if budget_s <= 0:  # not waited for (``PredictionQuery.wait_s``): no deadline, no wait
            return self._submit(text, None, key)[0]
        task, vec = self._submit(text, budget_s, key)
        try:
            return await asyncio.wait_for(asyncio.shield(task), budget_s)
        except TimeoutError:
            # A busy loop may wake for the timeout after the worker already made the vector: that
            # one is used (no further wait), not counted late.
            if vec.done() and not vec.cancelled() and vec.exception() is None:
                try:
                    return self.core.features_from(vec.result(), text)
                except Exception:  # the task meets the same failure and reports it
                    return task
            return task
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return exc

    def _without_features(
        self,
        query: PredictionQuery,
        model: str,
        pending: asyncio.Future[PromptFeatures] | BaseException,
    ) -> Prediction:
        """The prompt-length prior's answer while the features are late, or after the embedder failed."""
        prior = self.core.fallback(query.prompt_tokens, model)
        if isinstance(pending, BaseException):
            self.core.failed("semantic prediction failed; answering from the prior")
            return Prediction(self.core.tally(prior).distribution, prior.path)

        async def later() -> LengthDistribution | None:
            feats = await pending
            return self.core.predict_features(feats, query.prompt_tokens, model).distribution

        return Prediction(prior.distribution, PredictionPath.LATE, asyncio.ensure_future(later()), pending)

    def _remember(self, key: bytes, feats: PromptFeatures) -> None:
        self._recent.put(key, feats)

    async def _recorded_features(self, text: str, memo: object) -> PromptFeatures:
        """The features the prediction used (awaited if they were late), else embedded now."""
        if isinstance(memo, PromptFeatures):
            return memo
        if isinstance(memo, asyncio.Future):
            try:
                feats = await memo
                if isinstance(feats, PromptFeatures):
                    return feats
            except asyncio.CancelledError:
                raise
            except Exception:
                pass
        task, _ = self._submit(text, None)
        return await task


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
