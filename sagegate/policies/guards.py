"""Gateway guards of the LSSP panel: policies that screen admission as well as order the queue.

They read the fleet through :class:`~policies.base.LoadView` (``kv_usage`` is the reserved share of
KV after this request would be admitted to the best backend). A guard that HOLDs never holds while
nothing is in flight: an idle fleet must take work, or a request larger than the threshold would
wait forever. Every REJECT carries one of the class's documented ``reject_reasons``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Annotated, Any, cast

from sagegate.policies.base import (
    ADMIT,
    GATEWAY,
    Capability,
    LanePosition,
    LoadView,
    Policy,
    SchedRequest,
    Screening,
    Verdict,
    fcfs_tiebreak,
)
from sagegate.policies.deadline import (
    S_PER_OUTPUT_TOKEN,
    S_PER_PROMPT_TOKEN,
    latest_start,
    laxity,
    priority_weight,
)
from sagegate.policies.params import NonNegative, Positive, Range, checked
from sagegate.policies.prediction import predicted_output
from sagegate.policies.registry import register

_QUEUED, _IN_FLIGHT, _DONE = 0, 1, 2
Share = Annotated[float, Range(gt=0, le=1)]
"""A share of KV capacity: in (0, 1]."""


class _Guard(Policy):
    """Counts requests in flight (dispatched, not finished) so a HOLD never starves an idle fleet."""

    levels = frozenset({GATEWAY})
    capabilities = frozenset({Capability.USES_PREDICTION, Capability.SCREEN})

    def __init__(self) -> None:
        self.in_flight = 0

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        req.pstate = _QUEUED

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        if req.pstate != _IN_FLIGHT:
            self.in_flight += 1
        req.pstate = _IN_FLIGHT

    def on_finish(self, req: SchedRequest, now: float) -> None:
        if req.pstate == _IN_FLIGHT:
            self.in_flight -= 1
        req.pstate = _DONE

    def _hold(self, reason: str) -> Screening:
        return ADMIT if self.in_flight == 0 else Screening(Verdict.HOLD, reason)


@register("kv-constrained")
class KVConstrained(_Guard):
    """Admit while post-admission KV use ≤ 0.82 unless urgent; order by urgency, then size (LSSP panel).

    Urgent: laxity ≤ 0.25 s. Order: urgent first, then ``(I + 0.25·predicted O)/priority``, then
    laxity.

    Laxity uses the LSSP deadline rule's service estimate (``policies.deadline``); requests without a
    deadline are never urgent. Urgency depends on the clock, hence ``DYNAMIC_KEY``; laxity is the static
    latest start minus the clock, so the queue indexes requests by (size, latest start) in two lanes,
    relaxed and urgent, and moves each to the urgent lane as the clock reaches its latest start − 0.25 s.
    """

    capabilities = _Guard.capabilities | {Capability.DYNAMIC_KEY, Capability.LANE_KEY}

    @checked
    def __init__(
        self,
        kv_threshold: Share = 0.82,
        urgent_laxity_s: float = 0.25,
        output_weight: NonNegative = 0.25,
        s_per_prompt_token: NonNegative = S_PER_PROMPT_TOKEN,
        s_per_output_token: NonNegative = S_PER_OUTPUT_TOKEN,
    ) -> None:
        super().__init__()
        self.kv_threshold = kv_threshold
        self.urgent_laxity_s = urgent_laxity_s
        self.output_weight = output_weight
        self.s_in = s_per_prompt_token
        self.s_out = s_per_output_token

    def laxity(self, req: SchedRequest, now: float) -> float:
        return laxity(req, now, self.s_in, self.s_out)

    def urgent(self, req: SchedRequest, now: float) -> bool:
        return self.laxity(req, now) <= self.urgent_laxity_s

    def size(self, req: SchedRequest) -> float:
        return (req.prompt_tokens + self.output_weight * predicted_output(req)) / priority_weight(req)

    def key(self, req: SchedRequest, now: float) -> Any:
        lax = self.laxity(req, now)
        return (lax > self.urgent_laxity_s, self.size(req), lax, *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        ls = latest_start(req, self.s_in, self.s_out)
        return LanePosition("relaxed", (self.size(req), ls), ls if ls != math.inf else None)

    def after_flip(self, placed: LanePosition) -> LanePosition:
        return LanePosition("urgent", placed.rank)

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        size, ls = rank
        lax = ls - now
        return (lax > self.urgent_laxity_s, size, lax)

    def flipped(self, flip: float, now: float) -> bool:
        return flip - now <= self.urgent_laxity_s  # laxity(now) ≤ threshold: urgent from now on

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening:
        if load.kv_usage <= self.kv_threshold or self.urgent(req, now):
            return ADMIT
        return self._hold("kv_above_threshold")


@register("admission-control")
class AdmissionControl(_Guard):
    """Drop requests whose laxity is below a threshold (default: none); order by laxity (LSSP panel).

    The threshold is ``min_laxity_s``; None never drops.

    Laxity as in ``llf`` (LSSP deadline rule's service estimate); a request without a deadline has
    infinite laxity and is never dropped. Ordered by latest start (static: ``now`` cancels).
    """

    reject_reasons = frozenset({"laxity_below_threshold"})

    @checked
    def __init__(
        self,
        min_laxity_s: Annotated[float | None, Range()] = None,
        s_per_prompt_token: NonNegative = S_PER_PROMPT_TOKEN,
        s_per_output_token: NonNegative = S_PER_OUTPUT_TOKEN,
    ) -> None:
        super().__init__()
        self.min_laxity_s = min_laxity_s
        self.s_in = s_per_prompt_token
        self.s_out = s_per_output_token

    def key(self, req: SchedRequest, now: float) -> Any:
        ls = latest_start(req, self.s_in, self.s_out)
        return (ls == math.inf, ls if ls != math.inf else 0.0, *fcfs_tiebreak(req))

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening:
        if self.min_laxity_s is not None and laxity(req, now, self.s_in, self.s_out) < self.min_laxity_s:
            return Screening(Verdict.REJECT, "laxity_below_threshold")
        return ADMIT


@register("scorpio-guard")
class ScorpioGuard(_Guard):
    """SLO guard: TTFT-slack filter, urgency order, throttle at KV ≥ 0.65 (LSSP panel; Scorpio 2025).

    LSSP's robustness-panel guard, after Scorpio (Tang et al. 2025): it also throttles when the
    queue exceeds 3× the fleet's running capacity.

    Our reading of the terms:

    * *TTFT deadline*: ``arrival + ttft_slo_s`` when that is set; by default (None) the latest first
      token that can still meet the end-to-end deadline, ``deadline − s_out·predicted O``.
    * *TTFT slack*: TTFT deadline − now − ``s_in``·I (the prefill). Filter: a request whose slack is
      negative cannot make its first token in time and is rejected (``ttft_slack_exhausted``), as
      Scorpio's TTFT guard rejects unattainable requests.
    * *Urgency score*: ``priority / max(slack, slack_floor_s)``; the queue serves the most urgent
      first (least slack, weighted by priority); no TTFT deadline means urgency 0, FCFS.
    * *Throttle*: while the post-admission KV use is ≥ ``kv_threshold`` (0.65) or the queue holds
      more than ``queue_factor`` (3) × the fleet's running capacity, only urgent requests (slack ≤
      ``urgent_slack_s``) are admitted; the rest wait.

    Time-dependent, hence ``DYNAMIC_KEY``. Slack is a static *latest prefill start* minus the clock, so
    the queue indexes requests by latest prefill start in one lane per priority, moving each to a
    first-come-first-served lane once its slack reaches ``slack_floor_s`` (where urgency stops growing).
    """

    capabilities = _Guard.capabilities | {Capability.DYNAMIC_KEY, Capability.LANE_KEY}
    reject_reasons = frozenset({"ttft_slack_exhausted"})

    @checked
    def __init__(
        self,
        kv_threshold: Share = 0.65,
        queue_factor: Positive = 3.0,
        ttft_slo_s: Positive | None = None,
        urgent_slack_s: float = 0.5,
        slack_floor_s: Positive = 0.01,
        s_per_prompt_token: NonNegative = S_PER_PROMPT_TOKEN,
        s_per_output_token: NonNegative = S_PER_OUTPUT_TOKEN,
    ) -> None:
        super().__init__()
        self.kv_threshold = kv_threshold
        self.queue_factor = queue_factor
        self.ttft_slo_s = ttft_slo_s
        self.urgent_slack_s = urgent_slack_s
        self.slack_floor_s = slack_floor_s
        self.s_in = s_per_prompt_token
        self.s_out = s_per_output_token

    def ttft_deadline(self, req: SchedRequest) -> float:
        if self.ttft_slo_s is not None:
            return req.arrival_s + self.ttft_slo_s
        if req.deadline_s is None:
            return math.inf
        return req.deadline_s - self.s_out * predicted_output(req)

    def latest_prefill(self, req: SchedRequest) -> float:
        """When the prefill must start at the latest for the first token to make its deadline."""
        return self.ttft_deadline(req) - self.s_in * req.prompt_tokens

    def ttft_slack(self, req: SchedRequest, now: float) -> float:
        return self.latest_prefill(req) - now

    def urgency(self, req: SchedRequest, now: float) -> float:
        slack = self.ttft_slack(req, now)
        if slack == math.inf:
            return 0.0
        return priority_weight(req) / max(slack, self.slack_floor_s)

    def key(self, req: SchedRequest, now: float) -> Any:
        return (-self.urgency(req, now), *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        start = self.latest_prefill(req)
        if start == math.inf:
            return LanePosition("no-deadline", 0)  # urgency 0
        return LanePosition(("slack", priority_weight(req)), start, start)

    def after_flip(self, placed: LanePosition) -> LanePosition:
        _, w = cast(tuple[str, float], placed.lane)
        return LanePosition(("floor", w), 0)  # urgency w / slack_floor_s

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        if not isinstance(lane, tuple):
            return (-0.0,)
        kind, w = lane
        slack = rank - now if kind == "slack" else self.slack_floor_s
        return (-(w / max(slack, self.slack_floor_s)),)

    def flipped(self, flip: float, now: float) -> bool:
        return flip - now <= self.slack_floor_s

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening:
        slack = self.ttft_slack(req, now)
        if slack < 0:
            return Screening(Verdict.REJECT, "ttft_slack_exhausted")
        pressured = (
            load.kv_usage >= self.kv_threshold or load.queue_len > self.queue_factor * load.capacity_requests
        )
        if pressured and slack > self.urgent_slack_s:
            return self._hold("throttled")
        return ADMIT
