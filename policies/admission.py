"""Memory-aware admission: the one rule the live gateway and the simulated gateway both apply.

Each backend has a KV capacity in tokens. Every request in flight on it is *charged* its prompt, what
it has generated, and its predicted remaining output (a quantile of the predicted distribution given
that it has already run past what it generated), corrected as tokens stream. A backend admits while its
charge stays under ``target`` × capacity and the requests it reports waiting stay under
``max_waiting`` requests and ``max_waiting_tokens`` prompt tokens; among those that admit, the one
with the most room wins.

The rule's single job is to keep every backend saturated but not overflowing: holding back more only
buys a queue to reorder, at the price of throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from predictor.distribution import LengthDistribution


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    quantile: float = 0.5
    """Quantile of the predicted remaining output charged for a request."""
    target: float = 1.5
    """Share of KV capacity the charges may fill. Above 1 on purpose: a request is charged its whole
    predicted footprint from the start, but holds on average only ``I + O/2`` over its life (tuned in
    the simulator, see BENCHMARKS.md: 1.2 and below starved memory-bound engines)."""
    max_waiting: int = 256
    """A backend with this many requests waiting (not yet running) admits nothing more."""
    unknown_output: int = 256
    """Charge for output when a request has no prediction."""
    max_waiting_tokens: int = 2048
    """A backend with waiting requests admits another only while their prompt tokens stay within
    this: enough backlog to keep the next step busy, shallow enough that the order stays the
    gateway's to decide. (Tuned in the simulator, see BENCHMARKS.md: a cap of one waiting request
    starved engines serving many small requests; a deep backlog gave the ordering away.)"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError("admission quantile must be in [0, 1]")
        if self.target <= 0:
            raise ValueError("admission target must be positive")
        if self.max_waiting < 1:
            raise ValueError("admission max_waiting must be at least 1")
        if self.max_waiting_tokens < 1:
            raise ValueError("admission max_waiting_tokens must be at least 1")


@dataclass(slots=True)
class BackendLoad:
    """What the gateway knows of one backend when it decides."""

    capacity_tokens: int
    charged_tokens: float = 0.0
    waiting: int = 0
    running: int = 0
    healthy: bool = True
    waiting_tokens: int = 0
    """Prompt tokens of the waiting requests (the backlog the next step can take)."""

    def room(self, target: float) -> float:
        return target * self.capacity_tokens - self.charged_tokens


def predicted_total(pred: LengthDistribution | None, generated: int, quantile: float, unknown: int) -> int:
    """Predicted total output of a request that has generated ``generated`` tokens: the ``quantile``
    of the distribution conditioned on ``O > generated`` (past the support: a further 25%)."""
    if pred is None:
        return max(unknown, generated + 1)
    support, probs = pred.support, pred.probs
    tail = 0.0
    for o, p in zip(support, probs, strict=True):
        if o > generated:
            tail += p
    if tail <= 0.0:
        return generated + max(1, generated // 4)
    goal = quantile * tail
    acc = 0.0
    for o, p in zip(support, probs, strict=True):
        if o > generated:
            acc += p
            if acc >= goal - 1e-12:
                return o
    return support[-1]


class Charge:
    """A request's KV charge: ``prompt + max(generated, predicted total given generated)``.

    The predicted total is the quantile of the output distribution conditioned on ``O > generated``,
    which only changes when ``generated`` passes a support point, so it is recomputed only then. The
    charge is a function of ``generated`` alone — not of how often it was updated — so a simulator
    that folds many decode steps into one event charges exactly what a token-by-token stream does.
    """

    __slots__ = ("_cfg", "_next", "_pred", "_prompt", "_total", "value")

    def __init__(self, prompt_tokens: int, pred: LengthDistribution | None, cfg: AdmissionConfig) -> None:
        self._prompt = prompt_tokens
        self._pred = pred
        self._cfg = cfg
        self._next = 0
        self._total = 0
        self.value = 0.0
        self._recompute(0)

    def _recompute(self, generated: int) -> None:
        cfg = self._cfg
        self._total = predicted_total(self._pred, generated, cfg.quantile, cfg.unknown_output)
        # The conditioning event O > generated next changes at the first support point ≥ it.
        nxt = -1
        if self._pred is not None:
            for o in self._pred.support:
                if o > generated:
                    nxt = o
                    break
        # Past the support (or with no prediction) the estimate follows every token.
        self._next = nxt if nxt > 0 else generated + 1
        self.value = float(self._prompt + max(self._total, generated))

    def update(self, generated: int) -> float:
        """New charge after ``generated`` tokens; returns the change."""
        old = self.value
        if generated >= self._next:
            self._recompute(generated)
        else:
            self.value = float(self._prompt + max(self._total, generated))
        return self.value - old


def choose_backend(
    charge: float, backends: Sequence[BackendLoad], cfg: AdmissionConfig, prompt_tokens: int = 0
) -> int | None:
    """Index of the healthy backend with the most room that admits ``charge``, or None.

    An idle backend (nothing charged) always admits, so a request larger than any target still runs.
    """
    best: int | None = None
    best_room = float("-inf")
    for i, b in enumerate(backends):
        if not b.healthy or b.waiting >= cfg.max_waiting:
            continue
        if b.waiting and b.waiting_tokens + prompt_tokens > cfg.max_waiting_tokens:
            continue
        room = b.room(cfg.target)
        if (room >= charge or b.charged_tokens <= 0.0) and room > best_room:
            best, best_room = i, room
    return best
