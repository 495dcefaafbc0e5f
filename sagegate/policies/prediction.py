"""Prediction-based orderings: SSJF, LTR and TRAIL, plus the helpers every predicting policy uses.

A request without a prediction (``req.prediction is None``: a live gateway with no predictor wired,
or a cold start) is treated as drawn from the predictors' own cold-start prior,
:data:`predictor.baselines.DEFAULT_PRIOR` (a point at 256 tokens, also the admission rule's
``unknown_output``), so every policy degrades to the same guess instead of failing.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Annotated, Any

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution
from sagegate.policies.base import (
    ENGINE,
    GATEWAY,
    Capability,
    LanePosition,
    Policy,
    SchedRequest,
    fcfs_tiebreak,
)
from sagegate.policies.params import Positive, Range, checked
from sagegate.policies.registry import register

UNKNOWN_OUTPUT: float = DEFAULT_PRIOR.mean
"""Predicted output tokens of a request that has no prediction (see the module docstring)."""


def prior_of(req: SchedRequest) -> LengthDistribution:
    """The request's predicted distribution, or the cold-start prior when it has none."""
    return req.prediction if req.prediction is not None else DEFAULT_PRIOR


def predicted_output(req: SchedRequest) -> float:
    """Point prediction of the output length: the distribution's mean (prior mean if none)."""
    return req.prediction.mean if req.prediction is not None else UNKNOWN_OUTPUT


def conditional_mean(dist: LengthDistribution, generated: int) -> float | None:
    """``E[O | O > generated]``, or None when no support point lies above ``generated``."""
    num = 0.0
    den = 0.0
    for o, p in zip(dist.support, dist.probs, strict=True):
        if o > generated:
            num += o * p
            den += p
    return num / den if den > 0.0 else None


def expected_remaining(dist: LengthDistribution, generated: int) -> float:
    """Predicted remaining output after ``generated`` tokens: ``E[O | O > g] − g``.

    Past the whole support the request has outlived every length its predictor thought possible;
    as in the Gittins core (``policies.gittins``), the remaining work is then taken equal to the work
    already done (``g``), so a runaway request sinks behind fresh ones but stays schedulable.
    """
    cond = conditional_mean(dist, generated)
    if cond is None:
        return float(max(1, generated))
    return cond - generated


# --- SSJF ---------------------------------------------------------------------------------------
@register("ssjf")
class SSJF(Policy):
    """Shortest predicted output (point value) first, with a starvation guard (Qiu et al., AIOps'24).

    Non-preemptive, as published. The paper states no starvation guard; ours: a request that has
    waited ``starvation_s`` seconds (since it last entered a queue) goes ahead of every
    non-starving request, first come first served among the starving. Time-dependent, hence
    ``DYNAMIC_KEY``.
    """

    levels = frozenset({GATEWAY, ENGINE})
    # lanes: waiting by prediction; starving (flipped after starvation_s) by waiting time
    capabilities = frozenset({Capability.DYNAMIC_KEY, Capability.LANE_KEY, Capability.USES_PREDICTION})

    @checked
    def __init__(self, starvation_s: Positive = 30.0) -> None:
        self.starvation_s = starvation_s

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        req.pstate = now

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        req.pstate = now

    def key(self, req: SchedRequest, now: float) -> Any:
        since = req.pstate if req.pstate is not None else req.arrival_s
        if now - since >= self.starvation_s:
            return (0, since, *fcfs_tiebreak(req))
        return (1, predicted_output(req), *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        since = req.pstate if req.pstate is not None else req.arrival_s
        return LanePosition("waiting", predicted_output(req), since)

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        return (0 if lane == "starving" else 1, rank)

    def flipped(self, flip: float, now: float) -> bool:
        return now - flip >= self.starvation_s

    def after_flip(self, placed: LanePosition) -> LanePosition:
        return LanePosition("starving", placed.flip)  # by when it started waiting


# --- LTR ----------------------------------------------------------------------------------------
class _LtrState:
    __slots__ = ("score", "since_round")

    def __init__(self, score: float, since_round: int) -> None:
        self.score = score
        self.since_round = since_round


@register("ltr")
class LearningToRank(Policy):
    """Order by a predicted rank score, promoting a request passed over N rounds (Fu et al., NeurIPS'24).

    A request passed over for ``starvation_rounds`` scheduling rounds (200, the setting ``starv200``
    of the authors' evaluation) is promoted. The score is the predicted mean output: LTR only needs
    the *ranking* of lengths, and the mean is the rank-preserving summary every predictor here
    gives. A *round* is one scheduling instant: a distinct time at which this policy saw a dispatch
    or tokens produced (at engine level, one engine step; at gateway level, one dispatch pass). A
    request's count restarts whenever it (re)enters a queue. Promoted requests go first, first come
    first served. Non-preemptive. The promotion depends on other requests' progress, hence
    ``DYNAMIC_KEY``.
    """

    levels = frozenset({GATEWAY, ENGINE})
    # lanes: waiting by score; promoted (flipped after starvation_rounds) by round entered
    capabilities = frozenset(
        {Capability.DYNAMIC_KEY, Capability.LANE_KEY, Capability.USES_PREDICTION, Capability.PROGRESS_HOOK}
    )

    @checked
    def __init__(self, starvation_rounds: Annotated[int, Range(ge=1)] = 200) -> None:
        self.starvation_rounds = starvation_rounds
        self.rounds = 0
        self._last_now: float | None = None

    def _tick(self, now: float) -> None:
        if now != self._last_now:
            self._last_now = now
            self.rounds += 1

    def _state(self, req: SchedRequest) -> _LtrState:
        st = req.pstate
        if st is None:
            st = req.pstate = _LtrState(predicted_output(req), self.rounds)
        return st

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        req.pstate = _LtrState(predicted_output(req), self.rounds)

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        self._state(req).score = predicted_output(req)  # the round it entered stays

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        self._state(req).since_round = self.rounds

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        self._tick(now)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        self._tick(now)

    def passed_over(self, req: SchedRequest) -> int:
        """Scheduling rounds ``req`` has waited through since it last entered a queue."""
        return self.rounds - self._state(req).since_round

    def key(self, req: SchedRequest, now: float) -> Any:
        st = self._state(req)
        if self.rounds - st.since_round >= self.starvation_rounds:
            return (0, st.since_round, 0.0, *fcfs_tiebreak(req))
        return (1, 0, st.score, *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        st = self._state(req)
        return LanePosition("waiting", st.score, st.since_round)

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        return (0, rank, 0.0) if lane == "promoted" else (1, 0, rank)

    def flipped(self, flip: float, now: float) -> bool:
        return self.rounds - flip >= self.starvation_rounds

    def after_flip(self, placed: LanePosition) -> LanePosition:
        return LanePosition("promoted", placed.flip)  # by the round it started waiting in


# --- TRAIL --------------------------------------------------------------------------------------
class _TrailState:
    """Cached ``E[O | O > g]``: constant until ``g`` reaches the next support point ``next_at``."""

    __slots__ = ("cond_mean", "dist", "initial", "next_at")

    def __init__(self, dist: LengthDistribution, generated: int) -> None:
        self.dist = dist
        self.initial = dist.mean
        self.cond_mean: float | None = None
        self.next_at = 0
        self.refresh(generated)

    def refresh(self, generated: int) -> None:
        self.cond_mean = conditional_mean(self.dist, generated)
        nxt = next((o for o in self.dist.support if o > generated), None)
        self.next_at = nxt if nxt is not None else 1 << 62

    def remaining(self, generated: int) -> float:
        if generated >= self.next_at:
            self.refresh(generated)
        if self.cond_mean is None:
            return float(max(1, generated))  # past the support: see expected_remaining
        return self.cond_mean - generated


@register("trail")
class Trail(Policy):
    """Shortest predicted remaining length, refined per token, limited preemption (Shahout et al., ICLR'25).

    TRAIL. The refined remaining length is ``E[O | O > g] − g`` over the predicted distribution (a point
    prediction degenerates to ``o − g``); it is cached per request and recomputed only when ``g``
    passes a support point, so a key is O(1). Engine level: a better waiting request may displace
    the running request with the longest predicted remainder, but never one that has generated
    ``preempt_limit`` (80%) or more of its *initial* prediction, and at most half the batch per step.
    Gateway level: the same order, without preemption.
    """

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset(
        {
            Capability.USES_PREDICTION,
            Capability.PREEMPT,
            Capability.REKEY_ON_PROGRESS,
            Capability.PROGRESS_HOOK,
        }
    )
    max_preempt_share = 0.5

    @checked
    def __init__(self, preempt_limit: Annotated[float, Range(ge=0, le=1)] = 0.8) -> None:
        self.preempt_limit = preempt_limit

    def _state(self, req: SchedRequest) -> _TrailState:
        st = req.pstate
        if st is None:
            st = req.pstate = _TrailState(prior_of(req), req.generated)
        return st

    def remaining(self, req: SchedRequest) -> float:
        """Predicted remaining output tokens of ``req`` now."""
        return self._state(req).remaining(req.generated)

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self._state(req).remaining(req.generated), *fcfs_tiebreak(req))

    def may_preempt(self, victim: SchedRequest, now: float) -> bool:
        return victim.generated < self.preempt_limit * self._state(victim).initial

    def pick_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest | None:
        """Memory ran out: the longest predicted remainder among the preemptible ones; if all are
        past the limit, memory must still be freed, so the longest overall."""
        if not running:
            return None
        allowed = [r for r in running if self.may_preempt(r, now)]
        return max(allowed or running, key=lambda r: self.key(r, now))

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self._state(req)

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        req.pstate = None  # the refined remainder (and the preemption limit) were the old prediction's
        self._state(req)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        st = self._state(req)
        if req.generated >= st.next_at:
            st.refresh(req.generated)
