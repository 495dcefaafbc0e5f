"""The gateway's output-length predictor, behind one small async interface.

``none``: no prediction (the policy sees prompt length only). ``global`` / ``length-bucket``: the
history baselines of ``predictor.baselines`` (cheap, run inline). ``semantic``: the product's predictor
(similar past prompts), whose embedding runs off the event loop; its history is in-process, or in
Redis when ``redis_url`` is set so several gateway replicas learn from each other.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from core.distribution import LengthDistribution
from core.request import PredictionQuery

log = logging.getLogger("sagegate.gateway")

DRAIN_S = 1.0
"""At shutdown, how long outcomes still being recorded (an embedding in flight) may hold the exit."""


@dataclass(slots=True)
class PredictInput:
    prompt: Any
    """The completion prompt or the chat messages."""
    prompt_tokens: int
    model: str
    tenant: str = "default"
    features: Any = None
    """What the predictor computed from the prompt (the embedding), kept to record the outcome
    without computing it again."""


class GatewayPredictor(Protocol):
    name: str

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        """The output-length distribution (None: no idea) and the path taken (for metrics)."""
        ...

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        """The request finished with ``output_tokens`` tokens: learn from it."""
        ...

    async def astart(self) -> None:
        """Load history, connect, load models (called once before serving: /ready waits for it)."""
        ...

    async def aclose(self) -> None: ...


class NoPredictor:
    name = "none"

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        return None, "none"

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        return None

    async def astart(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class BaselinePredictor:
    """A ``predictor.baselines`` history predictor (sync, microseconds), fed prompt lengths only."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name

    @staticmethod
    def _trace(inp: PredictInput) -> PredictionQuery:
        return PredictionQuery(rid=0, prompt_tokens=inp.prompt_tokens, tenant=inp.tenant, model=inp.model)

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        return self.inner.predict(self._trace(inp)), self.name

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        self.inner.observe(self._trace(inp), output_tokens)

    async def astart(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class SemanticAdapter:
    """``predictor.semantic.SemanticPredictor``: its async face keeps the embedding off the loop.

    A prediction waits at most ``budget_s`` for the embedding: past that the request is ranked from
    the prompt-length prior at once (path ``late``), so a busy embedder delays no request. The
    embedding still completes and is what the outcome is recorded under, computed once.
    """

    name = "semantic"

    def __init__(self, inner: Any, budget_s: float = 0.05) -> None:
        self.inner = inner
        self.budget_s = budget_s

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        task = asyncio.ensure_future(self.inner.afeatures(inp.prompt))
        try:
            feats = await asyncio.wait_for(asyncio.shield(task), self.budget_s)
        except TimeoutError:
            inp.features = task  # resolved in record()
            pred = self.inner.fallback(inp.prompt_tokens, inp.model)
            return pred.distribution, "late"
        except Exception:  # the embedder failed: the predictor's own fallback answers
            pred = await self.inner.apredict(inp.prompt, inp.prompt_tokens, model=inp.model)
            return pred.distribution, str(pred.path)
        pred = self.inner.predict_features(feats, inp.prompt_tokens, inp.model)
        inp.features = feats
        return pred.distribution, str(pred.path)

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        given = inp.features if inp.features is not None else inp.prompt  # one embedding per request
        if isinstance(given, asyncio.Future):
            try:
                given = await given
            except Exception:
                given = inp.prompt
        await self.inner.arecord(given, inp.prompt_tokens, output_tokens, model=inp.model, tenant=inp.tenant)

    async def astart(self) -> None:
        await asyncio.to_thread(self.inner.start)  # reads the history window (Redis I/O)
        await asyncio.to_thread(self.inner.warm_up)  # the model loads before /ready, not on a request

    async def aclose(self) -> None:
        await asyncio.to_thread(self.inner.close)


def build_predictor(name: str, redis_url: str | None = None, options: dict[str, Any] | None = None) -> Any:
    """A :class:`GatewayPredictor` by name (``none``, ``global``, ``length-bucket``, ``semantic``)."""
    opts = dict(options or {})
    if name == "none":
        return NoPredictor()
    if name == "global":
        from predictor.baselines import GlobalPredictor

        return BaselinePredictor(GlobalPredictor(**opts), name)
    if name == "length-bucket":
        from predictor.baselines import LengthBucketPredictor

        return BaselinePredictor(LengthBucketPredictor(**opts), name)
    if name == "semantic":
        from predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, MiniLMEmbedder
        from predictor.semantic import make_semantic

        # One torch thread: on a busy CPU more threads oversubscribe it (measured: 800 ms per
        # embedding with the default on a loaded 2-core machine, 38 ms with one).
        threads = int(opts.pop("embed_threads", 1))
        budget = float(opts.pop("predict_budget_s", 0.05))
        # The embedding's window (word pieces) and int8 layers; the defaults are the fast ones.
        # ``embed_window: 256, embed_quantize: false`` is the first, slower configuration (its own
        # history: the Redis stream is keyed by embedding version).
        window = int(opts.pop("embed_window", DEFAULT_WINDOW))
        quantize = _flag(opts.pop("embed_quantize", DEFAULT_QUANTIZE))
        opts.setdefault("embedder", MiniLMEmbedder(threads=threads, window=window, quantize=quantize))
        return SemanticAdapter(make_semantic(redis_url=redis_url, **opts), budget)
    raise ValueError(f"unknown predictor {name!r}")


def _flag(value: Any) -> bool:
    """A boolean option that may arrive as text (environment variables, JSON strings)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def cap(dist: LengthDistribution | None, max_tokens: int | None) -> LengthDistribution | None:
    """The distribution given the client's ``max_tokens``: mass beyond it moves onto it."""
    return None if dist is None else dist.capped(max_tokens)


class Recorder:
    """Fire-and-forget history updates: a response never waits for the predictor to learn."""

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self._tasks: set[asyncio.Task[None]] = set()

    def record(self, inp: PredictInput, output_tokens: int) -> None:
        task = asyncio.get_running_loop().create_task(self._record(inp, output_tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, inp: PredictInput, output_tokens: int) -> None:
        try:
            await self.predictor.record(inp, output_tokens)
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
