"""FastServe's skip-join multi-level feedback queue (Wu et al. 2023, "Fast Distributed Inference
Serving for Large Language Models").

Queue ``k`` has quantum ``base·2^k``. A new request *skips* the queues whose quantum is shorter than
its first iteration (its prefill) and joins the first that covers it; it is demoted one queue each
time it has used up its quantum of running time there; a request that has waited ``starvation_s``
goes back to the top queue. Within a queue, first come first served.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Annotated, Any

from sagegate.policies.base import (
    ENGINE,
    GATEWAY,
    Capability,
    LanePosition,
    Policy,
    SchedRequest,
    fcfs_tiebreak,
)
from sagegate.policies.params import NonNegative, Positive, Range, checked
from sagegate.policies.registry import register


class _MlfqState:
    __slots__ = ("level", "mark", "used_s", "waiting_since")

    def __init__(self, level: int, now: float) -> None:
        self.level = level
        self.used_s = 0.0
        self.mark = now  # when service was last accounted
        self.waiting_since: float | None = now  # None while running


@register("fastserve")
class FastServe(Policy):
    """Skip-join MLFQ, quanta doubling from 10 ms, promotion after 3 s waiting (Wu et al. 2023, FastServe).

    Quanta double per queue from ``base_quantum_ms``; a new request skips to the first queue whose
    quantum covers its prefill; it is demoted after a used-up quantum and promoted to the top queue
    after ``starvation_s`` of waiting.
    Running time is measured on the caller's clock: from dispatch to each token (``on_progress``),
    so a request is charged its prefill and its decode steps, queueing excluded. The prefill time
    that decides the skip-join is estimated as ``prefill_s_per_token`` × prompt tokens (25 µs: an
    8B model on an H100 prefills at ≈ 22 µs/token plus attention, docs/design/engine_model.md). ``queues`` is
    the number of queues; the last one has no demotion. Engine level: preemptive (a waiting request
    in a higher queue displaces the running one in the lowest queue). Gateway level: queue levels
    only (requests leave the gateway queue once, so only skip-join and starvation matter there).
    """

    levels = frozenset({GATEWAY, ENGINE})
    # lanes: one per queue level; a waiting request flips to the top one when it starves
    capabilities = frozenset(
        {
            Capability.DYNAMIC_KEY,
            Capability.LANE_KEY,
            Capability.PREEMPT,
            Capability.REKEY_ON_PROGRESS,
            Capability.PROGRESS_HOOK,
        }
    )

    @checked
    def __init__(
        self,
        base_quantum_ms: Positive = 10.0,
        queues: Annotated[int, Range(ge=1)] = 8,
        starvation_s: Positive = 3.0,
        prefill_s_per_token: NonNegative = 25e-6,
    ) -> None:
        self.base_quantum_s = base_quantum_ms / 1000.0
        self.queues = queues
        self.starvation_s = starvation_s
        self.prefill_s_per_token = prefill_s_per_token

    def quantum(self, level: int) -> float:
        """Quantum of queue ``level`` in seconds (``inf`` for the last queue)."""
        if level >= self.queues - 1:
            return float("inf")
        return self.base_quantum_s * (1 << level)

    def join_level(self, prompt_tokens: int) -> int:
        """Skip-join: the first queue whose quantum covers the estimated prefill time."""
        first_iteration = prompt_tokens * self.prefill_s_per_token
        level = 0
        while level < self.queues - 1 and self.quantum(level) < first_iteration:
            level += 1
        return level

    def _state(self, req: SchedRequest, now: float) -> _MlfqState:
        st = req.pstate
        if st is None:
            st = req.pstate = _MlfqState(self.join_level(req.prompt_tokens), now)
        return st

    def level_of(self, req: SchedRequest, now: float) -> int:
        """The queue ``req`` is in at ``now`` (0 = highest priority)."""
        st = self._state(req, now)
        if st.waiting_since is not None and now - st.waiting_since >= self.starvation_s:
            return 0
        return st.level

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self.level_of(req, now), *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        st = self._state(req, now)
        starves = st.waiting_since is not None and st.level != 0
        return LanePosition(st.level, 0, st.waiting_since if starves else None)

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        return (lane,)

    def flipped(self, flip: float, now: float) -> bool:
        return now - flip >= self.starvation_s

    def after_flip(self, placed: LanePosition) -> LanePosition:
        return LanePosition(0, 0)  # promoted: the top queue

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        st = self._state(req, now)
        st.waiting_since = now

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        st = self._state(req, now)
        if st.waiting_since is not None and now - st.waiting_since >= self.starvation_s:
            st.level = 0  # promotion: a fresh top-queue quantum
            st.used_s = 0.0
        st.waiting_since = None
        st.mark = now

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        st = self._state(req, now)
        if st.waiting_since is not None:
            return
        st.used_s += now - st.mark
        st.mark = now
        while st.used_s >= self.quantum(st.level):
            st.used_s -= self.quantum(st.level)
            st.level += 1

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        st = self._state(req, now)
        st.waiting_since = now
