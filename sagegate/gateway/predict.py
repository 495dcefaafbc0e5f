"""The gateway's side of the predictor seam: build the one predictor the settings name, ask it about
a request, and record the outcome without making the response wait.

``none``: no prediction (the policy sees prompt length only). Every other predictor comes from the
one factory (:func:`predictor.factory.make_predictor`) behind the one interface the simulator calls
too (:class:`core.predictor.LengthPredictor`): ``global`` / ``length-bucket`` answer from memory in
microseconds (with ``redis_url``, learning from every replica's completions); ``semantic`` embeds off
the event loop and waits at most ``predict_budget_s`` for it (:mod:`predictor.semantic_face`).
"""

from __future__ import annotations

import asyncio
import logging

from sagegate.core.distribution import LengthDistribution
from sagegate.core.outcomes import PredictionPath
from sagegate.core.predictor import Asked, LengthPredictor, Prediction
from sagegate.core.request import PredictionQuery
from sagegate.gateway.settings_predictor import AnyPredictorSettings, predictor_options
from sagegate.predictor.embedder import PromptLike, flatten_prompt, is_token_ids
from sagegate.predictor.factory import make_predictor

log = logging.getLogger("sagegate.gateway")

DRAIN_S = 1.0
"""At shutdown, how long outcomes still being recorded (an embedding in flight) may hold the exit."""


class NoPredictor:
    """``predictor: none``: every request goes on without a prediction."""

    name = "none"

    async def predict(self, query: PredictionQuery) -> Prediction:
        return Prediction(None, PredictionPath.NONE)

    async def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def build_predictor(
    name: str, redis_url: str | None = None, options: AnyPredictorSettings | None = None
) -> LengthPredictor:
    """The gateway's predictor ``name`` with ``options`` (default: its defaults)."""
    opts = options if options is not None else predictor_options(name)
    if opts.predictor != name:
        raise ValueError(f"options of predictor {opts.predictor!r} given for predictor {name!r}")
    factory_options = opts.factory_options(redis_url)
    if factory_options is None:
        return NoPredictor()
    return make_predictor(name, factory_options)


def query_of(rid: int, prompt: PromptLike, prompt_tokens: int, model: str, tenant: str) -> PredictionQuery:
    """What the predictor is asked about a client's request: its text (None for token ids) and who
    sent it."""
    text = None if is_token_ids(prompt) else flatten_prompt(prompt)
    return PredictionQuery(rid, prompt_tokens, text, tenant, model)


def cap(dist: LengthDistribution | None, max_tokens: int | None) -> LengthDistribution | None:
    """The distribution given the client's ``max_tokens``: mass beyond it moves onto it."""
    return None if dist is None else dist.capped(max_tokens)


class Recorder:
    """Fire-and-forget history updates: a response never waits for the predictor to learn."""

    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Updates not yet recorded (0 once the history has every outcome so far)."""
        return len(self._tasks)

    def record(self, asked: Asked, output_tokens: int) -> None:
        task = asyncio.get_running_loop().create_task(self._record(asked, output_tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, asked: Asked, output_tokens: int) -> None:
        try:
            await self.predictor.observe(asked.query, output_tokens, asked.prediction.memo)
        except Exception:
            log.exception("predictor failed to record an outcome")

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Let pending updates finish for up to ``timeout_s`` (shutdown), then cancel the rest."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(list(self._tasks), timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
            log.info("shutdown: %d history updates not recorded", len(late))
