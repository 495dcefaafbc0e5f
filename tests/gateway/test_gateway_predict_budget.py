"""A slow embedder never holds a request: past the budget it is ranked from the prior, and the
outcome is still recorded under the one embedding computed for it."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.distribution import LengthDistribution
from gateway.predict import PredictInput, SemanticAdapter
from predictor.semantic_async import FeaturesJob


class _PriorCore:
    def fallback(self, prompt_tokens: int, model: str | None = None):
        return type("P", (), {"distribution": LengthDistribution.point(100), "path": "bucket"})()

    def predict_features(self, feats: object, prompt_tokens: int, model: str | None = None):
        return type("P", (), {"distribution": LengthDistribution.point(7), "path": "semantic"})()


class _SlowFace:
    """An async semantic face whose embedding takes ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.core = _PriorCore()
        self.embedded = 0
        self.recorded: list[object] = []

    async def features(self, prompt: object, budget_s: float | None = None) -> str:
        await asyncio.sleep(self.delay_s)
        self.embedded += 1
        return f"features-of-{prompt}"

    def begin_features(self, prompt: object, budget_s: float | None = None) -> FeaturesJob:
        return FeaturesJob(asyncio.ensure_future(self.features(prompt, budget_s)), lambda: None)  # type: ignore[arg-type]

    async def record(self, given: object, *args: object, **kw: object) -> bool:
        self.recorded.append(given)
        return True


class _SlowLoopFace(_SlowFace):
    """The worker made the vector at once, but the loop is too busy to pick it up within the budget
    (its resolving task lags ``delay_s``)."""

    def begin_features(self, prompt: object, budget_s: float | None = None) -> FeaturesJob:
        return FeaturesJob(
            asyncio.ensure_future(self.features(prompt, budget_s)),  # type: ignore[arg-type]
            lambda: f"ready-{prompt}",  # type: ignore[arg-type,return-value]
        )


def _predict_then_record(
    face: _SlowFace, budget_s: float, prompt: str, outcome: int
) -> tuple[float, str, float, PredictInput]:
    """One request through the adapter over ``face``: its wait, path and predicted mean, then its
    completion recorded."""

    async def run() -> tuple[float, str, float, PredictInput]:
        adapter = SemanticAdapter(face, budget_s=budget_s)  # type: ignore[arg-type]
        inp = PredictInput(prompt=prompt, prompt_tokens=10, model="m")
        t0 = time.perf_counter()
        dist, path = await adapter.predict(inp)
        waited = time.perf_counter() - t0
        await adapter.record(inp, outcome)
        assert dist is not None
        return waited, path, dist.mean, inp

    return asyncio.run(run())


def test_late_embedding_answers_from_the_prior_and_records_once():
    inner = _SlowFace(delay_s=0.3)
    waited, path, mean, _ = _predict_then_record(inner, 0.02, "p", 42)
    assert path == "late" and mean == 100  # the prior's answer, not the embedding's
    assert waited < 0.2  # did not wait for the 0.3 s embedding
    assert inner.embedded == 1 and inner.recorded == ["features-of-p"]


def test_prompt_embedding_within_budget_is_used():
    inner = _SlowFace(delay_s=0.0)
    _, path, mean, _ = _predict_then_record(inner, 1.0, "q", 5)
    assert path == "semantic" and mean == 7
    assert inner.embedded == 1 and inner.recorded == ["features-of-q"]


def test_a_vector_made_in_time_is_used_though_the_loop_was_slow_to_pick_it_up():
    """At the budget's end the adapter asks whether the worker has the vector already: then the
    prediction uses it (path ``semantic``) rather than the prior, and records under it."""
    inner = _SlowLoopFace(delay_s=0.3)
    waited, path, mean, inp = _predict_then_record(inner, 0.02, "r", 9)
    assert path == "semantic" and mean == 7 and inp.later is None
    assert waited < 0.2  # no wait past the budget for the lagging task
    assert inner.recorded == ["ready-r"]


@pytest.mark.heavy
def test_through_the_real_embedder_a_blocked_loop_does_not_make_a_prediction_late():
    """The real worker thread and MiniLM: the loop is blocked past the budget while the worker embeds
    (a busy gateway); the vector was made in time, so the prediction uses it."""
    from predictor.semantic import SemanticPredictor
    from predictor.semantic_async import AsyncSemantic
    from tests.semantic_support import real_embedder

    core = SemanticPredictor(real_embedder()).start()
    core.warm_up()
    adapter = SemanticAdapter(AsyncSemantic(core), budget_s=0.05)

    async def run() -> tuple[str, PredictInput]:
        inp = PredictInput(prompt="write a haiku about tea", prompt_tokens=6, model="m")
        task = asyncio.ensure_future(adapter.predict(inp))
        for _ in range(3):
            await asyncio.sleep(0)  # the job is submitted to the worker
        done = core.embedder.items + 1
        t0 = time.monotonic()
        while core.embedder.items < done and time.monotonic() - t0 < 10:
            time.sleep(0.005)  # the loop blocked: the worker runs, nothing on the loop does
        time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)) + 0.02)  # and past the budget
        _, path = await task
        return path, inp

    try:
        path, inp = asyncio.run(run())
    finally:
        core.close()
    assert core.embedder.items == 2  # the warm-up and this prompt: embedded once
    # no history for this model: the shipped prior answers over the vector ("cold"), not "late"
    assert path == "cold" and inp.later is None and inp.features is not None
