"""A slow embedder never holds a request: past the budget it is ranked from the prior, and the
outcome is still recorded under the one embedding computed for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import pytest

from sagegate.core.predictor import Prediction
from sagegate.core.request import PredictionQuery
from sagegate.predictor.semantic import PromptFeatures, SemanticPredictor
from sagegate.predictor.semantic_face import SemanticLengthPredictor
from tests.semantic_support import SlowEmbedder, slow_semantic


def _predict_then_record(
    predictor: SemanticLengthPredictor, prompt: str, outcome: int
) -> tuple[float, Prediction]:
    """One request through ``predictor``: its wait and its prediction, then its completion recorded."""

    async def run() -> tuple[float, Prediction]:
        query = PredictionQuery(0, 10, prompt, model="m")
        t0 = time.perf_counter()
        prediction = await predictor.predict(query)
        waited = time.perf_counter() - t0
        await predictor.observe(query, outcome, prediction.memo)
        return waited, prediction

    return asyncio.run(run())


def _embedded(predictor: SemanticLengthPredictor) -> int:
    embedder = predictor.core.embedder.embedder
    assert isinstance(embedder, SlowEmbedder)
    return embedder.texts


def _block_loop_while_the_worker_embeds(core: SemanticPredictor, vectors: int, budget_s: float) -> None:
    """Block the event loop (a busy gateway: nothing on the loop runs, the worker thread does) until
    the worker has made ``vectors`` vectors in all and the budget, counted from now, has passed."""
    t0 = time.monotonic()
    while core.embedder.items < vectors:
        assert time.monotonic() - t0 < 10, "the worker made no vector"
        time.sleep(0.005)
    # 20 ms more: the vector's future is set just after the count, and the budget's deadline (set
    # before t0) is past
    end = max(t0 + budget_s, time.monotonic()) + 0.02
    while time.monotonic() < end:
        time.sleep(0.005)


def test_late_embedding_answers_from_the_prior_and_records_once() -> None:
    predictor = slow_semantic(delay_s=0.3, budget_s=0.02)
    waited, prediction = _predict_then_record(predictor, "p", 42)
    assert prediction.path == "late" and prediction.later is not None
    assert waited < 0.2  # did not wait for the 0.3 s embedding
    assert _embedded(predictor) == 1 and predictor.core.counters.recorded == 1


def test_prompt_embedding_within_budget_is_used() -> None:
    predictor = slow_semantic(delay_s=0.0, budget_s=5.0)
    _, prediction = _predict_then_record(predictor, "q", 5)
    assert prediction.path == "cold" and prediction.later is None  # no history yet: its own vector's prior
    assert isinstance(prediction.memo, PromptFeatures)
    assert _embedded(predictor) == 1 and predictor.core.counters.recorded == 1


def test_a_vector_made_in_time_is_used_though_the_loop_was_slow_to_pick_it_up() -> None:
    """At the budget's end the predictor asks whether the worker has the vector already: then the
    prediction uses it rather than the prior, and records under it."""
    predictor = slow_semantic(delay_s=0.0, budget_s=0.05)

    async def run() -> Prediction:
        vectors = predictor.core.embedder.items + 1
        task = asyncio.ensure_future(predictor.predict(PredictionQuery(0, 10, "r", model="m")))
        for _ in range(3):
            await asyncio.sleep(0)  # the job is submitted to the worker
        _block_loop_while_the_worker_embeds(predictor.core, vectors, 0.05)  # past the budget (0.05 s)
        return await task

    prediction = asyncio.run(run())
    assert prediction.path == "cold" and prediction.later is None
    assert isinstance(prediction.memo, PromptFeatures) and _embedded(predictor) == 1


class _BrokenEmbedder(SlowEmbedder):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("the model is gone")


def test_a_failing_embedder_answers_from_the_prior_and_is_counted() -> None:
    predictor = SemanticLengthPredictor(SemanticPredictor(_BrokenEmbedder()), budget_s=1.0)
    _, prediction = _predict_then_record(predictor, "s", 5)
    assert prediction.distribution is not None and prediction.path == "cold" and prediction.later is None
    assert predictor.core.counters.errors == 2  # the prediction and the record, neither raised
    assert predictor.core.counters.recorded == 0


@pytest.mark.heavy
def test_through_the_real_embedder_a_blocked_loop_does_not_make_a_prediction_late() -> None:
    """The real worker thread and MiniLM: the loop is blocked past the budget while the worker embeds
    (a busy gateway); the vector was made in time, so the prediction uses it."""
    from tests.semantic_support import real_embedder

    core = SemanticPredictor(real_embedder()).start()
    core.warm_up()
    predictor = SemanticLengthPredictor(core, budget_s=0.05)

    async def run() -> Prediction:
        vectors = core.embedder.items + 1
        task = asyncio.ensure_future(
            predictor.predict(PredictionQuery(0, 6, "write a haiku about tea", model="m"))
        )
        for _ in range(3):
            await asyncio.sleep(0)  # the job is submitted to the worker
        _block_loop_while_the_worker_embeds(core, vectors, 0.05)  # and past the budget
        return await task

    try:
        prediction = asyncio.run(run())
    finally:
        core.close()
    assert core.embedder.items == 2  # the warm-up and this prompt: embedded once
    # no history for this model: the shipped prior answers over the vector ("cold"), not "late"
    assert prediction.path == "cold" and prediction.later is None and prediction.memo is not None


def test_an_exact_repeat_is_not_embedded_again_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sagegate.predictor.semantic_face as face

    monkeypatch.setattr(face, "RECENT_PROMPTS", 2)
    predictor = slow_semantic(delay_s=0.2, budget_s=1.0)

    async def ask(prompts: list[str]) -> list[Prediction]:
        return [await predictor.predict(PredictionQuery(i, 10, p, model="m")) for i, p in enumerate(prompts)]

    first, again = asyncio.run(ask(["a retried prompt", "a retried prompt"]))
    assert _embedded(predictor) == 1 and predictor.repeats == 1
    assert again.path == first.path == "cold" and again.memo is first.memo  # the same features, at once
    asyncio.run(ask(["second", "third", "a retried prompt"]))  # two newer prompts pushed it out
    assert _embedded(predictor) == 4 and predictor.repeats == 1
