"""Engine-variant policies: vLLM v0, vLLM v1, Sarathi-Serve (all FCFS), and SLAI.

These choose how the engine itself batches (``engine_variant``, ``engine_chunk_size``; the
simulator applies them, ``sim.des.engine_config_for``) more than how requests are ordered, so they
run at engine level only.
"""

from __future__ import annotations

import math
from typing import Any

from sagegate.policies.base import ENGINE, Capability, Policy, SchedRequest, fcfs_tiebreak
from sagegate.policies.fifo import FCFS
from sagegate.policies.params import NonNegative, Positive, checked
from sagegate.policies.registry import register


@register("vllm-v0")
class VllmV0(FCFS):
    """vLLM v0 engine: prefill-only or decode-only steps, no chunking; FCFS (vLLM).

    See docs/design/engine_model.md."""

    levels = frozenset({ENGINE})
    engine_variant = "v0"


@register("vllm-v1")
class VllmV1(FCFS):
    """vLLM v1 engine: chunked prefill, running requests first; FCFS (vLLM's default).

    See docs/design/engine_model.md."""

    levels = frozenset({ENGINE})
    engine_variant = "v1"


@register("sarathi")
class Sarathi(FCFS):
    """Sarathi-Serve engine: decodes first, then 512-token prefill chunks; FCFS (Agrawal et al., OSDI'24)."""

    levels = frozenset({ENGINE})
    engine_variant = "sarathi"
    engine_chunk_size = 512


class _SlaiState:
    __slots__ = ("last_token_s",)

    def __init__(self, now: float) -> None:
        self.last_token_s = now


class _EngineView:
    """What SLAI knows of one engine from the hooks: who waits, when it last admitted, its steps."""

    __slots__ = ("blocked", "had_waiting", "last_admit", "passed", "step", "waiting")

    def __init__(self) -> None:
        self.waiting: set[Any] = set()
        self.last_admit = -math.inf
        self.step = -math.inf  # start of the current step (first decode offered at that time)
        self.had_waiting = False  # requests waited when the current step was planned
        self.blocked = False  # the previous step had waiting requests and admitted none
        self.passed: Any = None  # the decode let through in the current step

    def new_step(self, now: float, first: Any) -> None:
        self.blocked = self.had_waiting and self.last_admit < self.step
        self.step, self.passed, self.had_waiting = now, first, bool(self.waiting)


@register("slai")
class SLAI(Policy):
    """Decode deferral by last schedulable time, shortest prefill first (Bari et al., arXiv 2508.01002).

    SLAI, with chunked prefill on a 512-token budget.

    * Engine: Sarathi-style (decodes, then prefill chunks), 512 tokens per step.
    * Admission: the waiting request with the fewest tokens to prefill (prompt plus any tokens
      generated before a preemption) first.
    * Deferral: a decoding request's next token is due ``tpot_slo_s`` after its last one; its *last
      schedulable time* is that minus ``step_estimate_s`` (one step must still fit). A decode whose
      last schedulable time has not come is left out of the step, giving its budget to prefills,
      but only while that budget is what holds prefills back: requests wait on the same engine, and
      the engine's previous step did not leave waiting requests un-admitted (a heuristic for
      "admission is blocked by KV blocks or the sequence cap", when deferring a decode would only
      slow it down; the engine does not tell a policy why admission stopped). The first decode the engine
      offers in each step is never deferred (nor the next, if that one is preempted), so deferral
      alone never leaves a step empty.

    SLAI targets a time-between-tokens SLO the traces do not carry; the default 0.1 s per output
    token is a common interactive target (an assumption of this project, not from the paper).
    Which engine a request is on is read from the driver's ``backend`` field when it has one.
    Memory victims: the largest context (default rule: the largest key).
    """

    levels = frozenset({ENGINE})
    engine_variant = "sarathi"
    engine_chunk_size = 512
    capabilities = frozenset({Capability.DEFER_DECODE, Capability.PROGRESS_HOOK})

    @checked
    def __init__(self, tpot_slo_s: Positive = 0.1, step_estimate_s: NonNegative = 0.03) -> None:
        self.tpot_slo_s = tpot_slo_s
        self.step_estimate_s = step_estimate_s
        self._engines: dict[Any, _EngineView] = {}

    def key(self, req: SchedRequest, now: float) -> Any:
        return (req.prompt_tokens + req.generated, *fcfs_tiebreak(req))

    def last_schedulable(self, req: SchedRequest) -> float:
        """Latest start of a step that still delivers ``req``'s next token within the SLO."""
        st = req.pstate
        last = st.last_token_s if isinstance(st, _SlaiState) else req.arrival_s
        return last + self.tpot_slo_s - self.step_estimate_s

    def defer_decode(self, req: SchedRequest, now: float) -> bool:
        v = self._view(req)
        if now != v.step:  # the first decode of a new step: always runs
            v.new_step(now, req.rid)
            return False
        if v.passed is None:  # the one let through was preempted: this one runs instead
            v.passed = req.rid
            return False
        if not v.waiting or v.blocked:
            return False
        return now < self.last_schedulable(req)

    # --- bookkeeping from the hooks ----------------------------------------------------------------
    def _view(self, req: SchedRequest) -> _EngineView:
        engine = getattr(req, "backend", None)
        v = self._engines.get(engine)
        if v is None:
            v = self._engines[engine] = _EngineView()
        return v

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self._view(req).waiting.add(req.rid)

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        v = self._view(req)
        v.waiting.add(req.rid)
        if v.step == now and v.passed == req.rid:
            v.passed = None

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        v = self._view(req)
        v.waiting.discard(req.rid)
        v.last_admit = now

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        st = req.pstate
        if isinstance(st, _SlaiState):
            st.last_token_s = now
        else:
            req.pstate = _SlaiState(now)

    def on_finish(self, req: SchedRequest, now: float) -> None:
        self._view(req).waiting.discard(req.rid)
