"""The gateway's output-length predictor, behind one small async interface.

``none``: no prediction (the policy sees prompt length only). ``global`` / ``length-bucket``: the
history baselines of ``predictor.baselines`` (cheap, run inline; with ``redis_url`` every replica
learns from every replica's completions, :mod:`predictor.shared_history`). ``semantic``: the
product's predictor (similar past prompts), whose embedding runs off the event loop; its history is
in-process, or in Redis when ``redis_url`` is set so several gateway replicas learn from each other.
Each is built by the one factory (:func:`predictor.factory.make_predictor`) and wrapped here in a
:class:`GatewayPredictor`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from core.distribution import LengthDistribution
from core.outcomes import PredictionPath
from core.predictor import LengthPredictor
from core.request import PredictionQuery
from gateway.settings import DEFAULT_BUDGET_S, PredictorSettings
from predictor.embedder import PromptLike, is_token_ids
from predictor.factory import make_predictor
from predictor.history import WindowBounds
from predictor.redis_store import RedisStore
from predictor.semantic import PromptFeatures, SemanticPredictor
from predictor.semantic_async import AsyncSemantic
from predictor.semantic_sim import SemanticLengthPredictor
from predictor.shared_history import SharedHistory

log = logging.getLogger("sagegate.gateway")

BASELINE_BOUNDS = WindowBounds(max_entries=20_000)
"""A shared baseline history's stream: the baselines' windows hold 2,000 outcomes by default (500 per
prompt-length bucket), and a starting replica loads what the stream keeps (24 h at most)."""

DRAIN_S = 1.0
"""At shutdown, how long outcomes still being recorded (an embedding in flight) may hold the exit."""


@dataclass(slots=True)
class PredictInput:
    prompt: PromptLike
    """The completion prompt or the chat messages."""
    prompt_tokens: int
    model: str
    tenant: str = "default"
    features: PromptFeatures | asyncio.Future[PromptFeatures] | None = None
    """What the predictor computed from the prompt (the embedding; still being computed when the
    prediction ran late), kept to record the outcome without computing it again."""
    later: asyncio.Future[LengthDistribution | None] | None = None
    """The prediction that missed its budget (path ``late``), still coming: the director ranks the
    request again by it if it still waits then."""


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
    """A ``predictor.baselines`` history predictor (sync, microseconds), fed prompt lengths only;
    ``shared``: the same predictor learning from every replica's completions too."""

    def __init__(self, inner: LengthPredictor, name: str, shared: SharedHistory | None = None) -> None:
        self.inner: LengthPredictor = inner if shared is None else shared
        self.name = name
        self.shared = shared

    @staticmethod
    def _trace(inp: PredictInput) -> PredictionQuery:
        return PredictionQuery(rid=0, prompt_tokens=inp.prompt_tokens, tenant=inp.tenant, model=inp.model)

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        return self.inner.predict(self._trace(inp)), self.name

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        self.inner.observe(self._trace(inp), output_tokens)

    async def astart(self) -> None:
        if self.shared is not None:
            loaded = await asyncio.to_thread(self.shared.start)
            log.info("%s predictor: %d completions from the shared history", self.name, loaded)

    async def aclose(self) -> None:
        if self.shared is not None:
            await asyncio.to_thread(self.shared.close)


class SemanticAdapter:
    """The semantic predictor's async face (:class:`predictor.semantic_async.AsyncSemantic`) as a
    :class:`GatewayPredictor`.

    A prediction waits at most ``budget_s`` for the embedding: past that the request is ranked from
    the prompt-length prior at once (path ``late``), so a busy embedder delays no request. The
    embedding still completes and is what the outcome is recorded under, computed once.
    """

    name = "semantic"

    def __init__(self, face: AsyncSemantic, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.face = face
        self.budget_s = budget_s

    @property
    def core(self) -> SemanticPredictor:
        return self.face.core

    async def predict(self, inp: PredictInput) -> tuple[LengthDistribution | None, str]:
        if is_token_ids(inp.prompt):  # nothing to embed
            pred = self.face.core.fallback(inp.prompt_tokens, inp.model)
            return pred.distribution, PredictionPath.NO_TEXT
        job = self.face.begin_features(inp.prompt, self.budget_s)
        task = job.task
        try:
            feats = await asyncio.wait_for(asyncio.shield(task), self.budget_s)
        except TimeoutError:
            # A busy loop may wake for the timeout before it has picked up a vector the worker
            # already made: that one is used (no further wait), not counted late.
            ready = job.ready()
            if ready is None:
                inp.features = task  # resolved in record()
                inp.later = asyncio.ensure_future(self._when_embedded(task, inp))
                pred = self.face.core.fallback(inp.prompt_tokens, inp.model)
                return pred.distribution, "late"
            feats = ready
        except Exception:  # the embedder failed: the predictor's own fallback answers
            pred = await self.face.predict(inp.prompt, inp.prompt_tokens, model=inp.model)
            return pred.distribution, str(pred.path)
        pred = self.face.core.predict_features(feats, inp.prompt_tokens, inp.model)
        inp.features = feats
        return pred.distribution, str(pred.path)

    async def _when_embedded(
        self, task: asyncio.Future[PromptFeatures], inp: PredictInput
    ) -> LengthDistribution | None:
        """The prediction the budget did not wait for, once its embedding is done."""
        feats = await task
        return self.face.core.predict_features(feats, inp.prompt_tokens, inp.model).distribution

    async def record(self, inp: PredictInput, output_tokens: int) -> None:
        if is_token_ids(inp.prompt):
            return
        given: PromptLike | PromptFeatures = inp.prompt  # one embedding per request
        if isinstance(inp.features, asyncio.Future):
            try:
                given = await inp.features
            except Exception:
                given = inp.prompt
        elif inp.features is not None:
            given = inp.features
        await self.face.record(given, inp.prompt_tokens, output_tokens, model=inp.model, tenant=inp.tenant)

    async def astart(self) -> None:
        await self.face.start()  # the history window and the model load before /ready, not on a request

    async def aclose(self) -> None:
        await self.face.close()


def build_predictor(
    name: str, redis_url: str | None = None, options: PredictorSettings | None = None
) -> GatewayPredictor:
    """The gateway's predictor ``name`` (``none`` or one of ``predictor.factory.LIVE_PREDICTORS``),
    built by the one factory and wrapped in its async adapter."""
    if name == "none":
        return NoPredictor()
    opts = options or PredictorSettings()
    built = make_predictor(name, opts.for_predictor(name, redis_url))
    if isinstance(built, SemanticLengthPredictor):
        return SemanticAdapter(AsyncSemantic(built.core), opts.predict_budget_s)
    if redis_url is None:
        return BaselinePredictor(built, name)
    store = RedisStore(redis_url, f"{opts.redis_prefix}:{name}", BASELINE_BOUNDS, embedded=False)
    return BaselinePredictor(built, name, SharedHistory(built, store))


def cap(dist: LengthDistribution | None, max_tokens: int | None) -> LengthDistribution | None:
    """The distribution given the client's ``max_tokens``: mass beyond it moves onto it."""
    return None if dist is None else dist.capped(max_tokens)


class Recorder:
    """Fire-and-forget history updates: a response never waits for the predictor to learn."""

    def __init__(self, predictor: GatewayPredictor) -> None:
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
