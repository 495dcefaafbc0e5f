"""The one interface every output-length predictor offers the simulator (and, through an async
adapter, the gateway). It imports no implementation."""

from __future__ import annotations

from typing import Protocol

from core.distribution import LengthDistribution
from core.request import PredictionQuery


class LengthPredictor(Protocol):
    """Asked once per request before it is queued; told the outcome when the request completes.

    Invariant: ``predict`` sees only a :class:`PredictionQuery`, which carries no outcome; an oracle
    is handed its answer key explicitly when it is built.
    """

    name: str

    def predict(self, req: PredictionQuery) -> LengthDistribution:
        """The distribution of the request's output length."""
        ...

    def observe(self, req: PredictionQuery, output_tokens: int) -> None:
        """The request completed with ``output_tokens`` tokens: it becomes history."""
        ...
