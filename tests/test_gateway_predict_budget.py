"""A slow embedder never holds a request: past the budget it is ranked from the prior, and the
outcome is still recorded under the one embedding computed for it."""

from __future__ import annotations

import asyncio
import time

from core.distribution import LengthDistribution
from gateway.predict import PredictInput, SemanticAdapter


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

    async def record(self, given: object, *args: object, **kw: object) -> bool:
        self.recorded.append(given)
        return True


def test_late_embedding_answers_from_the_prior_and_records_once():
    async def run() -> tuple[float, str, float, _SlowFace]:
        inner = _SlowFace(delay_s=0.3)
        adapter = SemanticAdapter(inner, budget_s=0.02)
        inp = PredictInput(prompt="p", prompt_tokens=10, model="m")
        t0 = time.perf_counter()
        dist, path = await adapter.predict(inp)
        waited = time.perf_counter() - t0
        await adapter.record(inp, 42)
        assert dist is not None
        return waited, path, dist.mean, inner

    waited, path, mean, inner = asyncio.run(run())
    assert path == "late" and mean == 100  # the prior's answer, not the embedding's
    assert waited < 0.2  # did not wait for the 0.3 s embedding
    assert inner.embedded == 1 and inner.recorded == ["features-of-p"]


def test_prompt_embedding_within_budget_is_used():
    async def run() -> tuple[str, float, _SlowFace]:
        inner = _SlowFace(delay_s=0.0)
        adapter = SemanticAdapter(inner, budget_s=1.0)
        inp = PredictInput(prompt="q", prompt_tokens=10, model="m")
        dist, path = await adapter.predict(inp)
        await adapter.record(inp, 5)
        assert dist is not None
        return path, dist.mean, inner

    path, mean, inner = asyncio.run(run())
    assert path == "semantic" and mean == 7
    assert inner.embedded == 1 and inner.recorded == ["features-of-q"]
