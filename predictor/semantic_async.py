"""The semantic core's async face: what an event loop (the gateway) calls.

Embeddings run on the embedder's worker thread (micro-batched), the history's start-up I/O and the
model load in a thread: nothing here blocks the loop, and nothing raises into a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from predictor.embedder import PromptLike, flatten_prompt
from predictor.semantic import Prediction, PromptFeatures, SemanticPredictor


@dataclass(frozen=True)
class FeaturesJob:
    """A prompt's features on their way: ``task`` resolves on the event loop; ``ready()`` gives them
    now if the worker thread has already produced the vector (None otherwise). A busy loop can be
    slower to pick a vector up than the worker was to make it: a caller whose budget ran out asks
    ``ready()`` before it gives up."""

    task: asyncio.Future[PromptFeatures]
    ready: Callable[[], PromptFeatures | None]


class AsyncSemantic:
    """``SemanticPredictor`` for async callers: embed, predict and record without blocking."""

    name = "semantic"

    def __init__(self, core: SemanticPredictor) -> None:
        self.core = core

    async def features(self, prompt: PromptLike, budget_s: float | None = None) -> PromptFeatures:
        """The prompt's features, embedded on the worker thread (may raise: the embedder failed).
        ``budget_s``: how long the caller will wait; the worker serves jobs that can still make it
        first (``predictor.embed_queue``)."""
        return await self.begin_features(prompt, budget_s).task

    def begin_features(self, prompt: PromptLike, budget_s: float | None = None) -> FeaturesJob:
        """As :meth:`features`, started now; see :class:`FeaturesJob`."""
        text = flatten_prompt(prompt)
        vec = self.core.embedder.submit(text, budget_s)

        async def resolve() -> PromptFeatures:
            return self.core.features_from(await asyncio.wrap_future(vec), text)

        def ready() -> PromptFeatures | None:
            if not vec.done() or vec.cancelled() or vec.exception() is not None:
                return None
            try:
                return self.core.features_from(vec.result(), text)
            except Exception:  # the task meets the same failure and reports it; here: not ready
                return None

        return FeaturesJob(asyncio.ensure_future(resolve()), ready)

    async def predict(self, prompt: PromptLike, prompt_tokens: int, model: str | None = None) -> Prediction:
        """The prediction for a prompt; a failure is answered from the prior, never raised."""
        try:
            return self.core.predict_features(await self.features(prompt), prompt_tokens, model)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.core.failed("semantic prediction failed; answering from the prior")
            return self.core.tally(self.core.fallback(prompt_tokens, model))

    async def record(
        self,
        given: PromptLike | PromptFeatures,
        prompt_tokens: int,
        output_tokens: int,
        model: str | None = None,
        tenant: str = "default",
        rid: str | None = None,
    ) -> bool:
        """A request completed (its features, or its prompt to embed): learn from it. Never raises
        (False on failure)."""
        try:
            feats = given if isinstance(given, PromptFeatures) else await self.features(given)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.core.failed("recording a completion failed")
            return False
        return self.core.record(feats, prompt_tokens, output_tokens, model, tenant, rid)

    async def start(self) -> None:
        """Read the history window (Redis I/O), then load the model, so no request waits for either."""
        await asyncio.to_thread(self.core.start)
        await asyncio.to_thread(self.core.warm_up)

    async def close(self) -> None:
        await asyncio.to_thread(self.core.close)
