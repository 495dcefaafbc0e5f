"""The one interface every output-length predictor offers: the gateway awaits it on its event loop,
the simulator drives it on its own clock (:func:`settle`). It imports no implementation.

Invariant: ``predict`` sees only a :class:`PredictionQuery`, which carries no outcome; an oracle is
handed its answer key explicitly when it is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import PredictionQuery

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Prediction:
    """One answer: the distribution of the output length (None: no idea) and the path that gave it.

    ``later``: the answer that missed the predictor's time budget, still coming (path ``late``); the
    gateway ranks a still-queued request again by it. ``memo``: what the predictor computed from the
    prompt (an embedding, or its future), handed back to :meth:`LengthPredictor.observe` so the
    outcome is learnt without computing it again. Both are opaque to the caller."""

    distribution: LengthDistribution | None
    path: str
    later: Awaitable[LengthDistribution | None] | None = None
    memo: object = None


@dataclass(frozen=True, slots=True)
class Asked:
    """A request's question to the predictor and its answer, kept (by the gateway and the simulator
    alike) to tell the predictor the outcome under both."""

    query: PredictionQuery
    prediction: Prediction


class LengthPredictor(Protocol):
    """Asked once per request before it is queued; told the outcome when the request completes.

    ``start`` runs once before the first question (history loads, models load); ``close`` once after
    the last. A predictor that answers from memory alone never waits inside ``predict`` or
    ``observe``: that is what lets the simulator call it (:func:`settle`)."""

    name: str

    async def predict(self, query: PredictionQuery) -> Prediction: ...

    async def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        """The request completed with ``output_tokens`` tokens (``memo``: its prediction's)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class InlinePredictor(ABC):
    """A predictor that answers from memory on the calling thread (every history baseline and
    oracle): it writes the two synchronous steps, the interface's coroutines come with it."""

    name: str

    @abstractmethod
    def predict_inline(self, query: PredictionQuery) -> LengthDistribution: ...

    def observe_inline(self, query: PredictionQuery, output_tokens: int) -> None:
        return None

    async def predict(self, query: PredictionQuery) -> Prediction:
        return Prediction(self.predict_inline(query), self.name)

    async def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        self.observe_inline(query, output_tokens)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class AtOnce:
    """A predictor asked and told on the caller's own clock (the simulator's): :func:`settle` of its
    coroutines, except that an :class:`InlinePredictor` keeping the interface's coroutines is called
    directly, with the same answers and without a coroutine per request."""

    __slots__ = ("_inline", "predictor")

    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        kind = type(predictor)
        self._inline = (
            predictor
            if isinstance(predictor, InlinePredictor)
            and kind.predict is InlinePredictor.predict
            and kind.observe is InlinePredictor.observe
            else None
        )

    def predict(self, query: PredictionQuery) -> Prediction:
        inline = self._inline
        if inline is not None:
            return Prediction(inline.predict_inline(query), inline.name)
        return settle(self.predictor.predict(query))

    def observe(self, query: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        if self._inline is not None:
            self._inline.observe_inline(query, output_tokens)
        else:
            settle(self.predictor.observe(query, output_tokens, memo))


def settle(step: Coroutine[Any, Any, T]) -> T:
    """The result of a predictor's coroutine that does not wait (the simulator's clock is its own,
    so nothing may wait on the wall clock): it runs to its end in one step, or this raises."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value
    step.close()
    raise RuntimeError("a predictor waited where it must answer at once (the simulator, a replay)")
