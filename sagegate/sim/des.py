"""The discrete-event simulator: a workload through a gateway queue and N engines.

It jumps from event to event — arrivals and step ends — never ticking a fixed clock. Two levels:

* ``engine``: requests go straight to the engines (round robin, as a plain load balancer would) and
  the policy orders each engine's waiting queue. ``--level engine --policy fcfs`` is vLLM alone.
* ``gateway``: requests wait in the gateway's queue, ordered by the policy, and are dispatched by the
  memory-aware admission rule to FCFS engines, through the live gateway's own dispatch pass
  (``policies.dispatch_loop``; its driver here is ``sim.gateway_level.SimGateway``).

Everything is deterministic for a workload, a policy and a seed.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sagegate.core.predictor import Asked, AtOnce, LengthPredictor
from sagegate.core.record import RequestRecord
from sagegate.core.request import PredictionQuery, TraceRequest
from sagegate.core.summary import summarize
from sagegate.policies.admission import AdmissionConfig
from sagegate.policies.base import ENGINE, GATEWAY, Capability, Policy
from sagegate.policies.engine_priority import PriorityPolicy, engine_priority
from sagegate.policies.fifo import FCFS
from sagegate.policies.interfaces import EngineKnobs
from sagegate.policies.pause import PauseConfig
from sagegate.policies.placement import DEFAULT_PROFILE, LEAST_LOADED, PlacementProfile
from sagegate.policies.queue import PolicyQueue
from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine, EngineRequest, SchedulerOutput
from sagegate.sim.gateway_level import QueueLimits, SimGateway
from sagegate.sim.perf import PerfModel

__all__ = [
    "QueueLimits",
    "SimResult",
    "SimSetup",
    "Simulation",
    "client_view",
    "engine_config_for",
    "simulate",
]


@dataclass
class SimSetup:
    """Everything a run needs besides the workload."""

    perf: PerfModel
    engine: EngineConfig = field(default_factory=EngineConfig)
    engines: int = 1
    level: str = ENGINE
    policy: Policy = field(default_factory=FCFS)
    predictor: LengthPredictor | None = None
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    fold_decode: bool = True
    """Fold runs of identical decode steps into one event (exact; off only to test that it is)."""
    lazy_decode: bool = True
    """Advance decoding requests together, unvisited, where the engine can (``sim.decode_cohort``;
    exact; off only to test that it is)."""
    cap_at_max_tokens: bool = True
    """Cap each prediction at the request's client cap (``TraceRequest.max_tokens``), as the live
    gateway's ``cap_at_max_tokens`` does."""
    queue_limits: QueueLimits | None = None
    """The live gateway's queue bounds at gateway level (None: an unbounded queue, no timeout)."""
    pause: PauseConfig = field(default_factory=PauseConfig)
    """Gateway level: pause running requests for better-ranked waiting work (``policies.pause``; off)."""
    engine_rank: bool = False
    """Gateway level: the engines run vLLM's priority scheduler and each request is sent with its
    rank at dispatch as its ``priority`` (``policies.engine_priority``; the live gateway's
    ``upstream.rank_priority`` to backends started with ``--scheduling-policy priority``)."""
    placement: str = LEAST_LOADED
    """Gateway level: ``cache_aware`` weighs each engine's predicted cached prefix (``policies.placement``,
    the live gateway's default); ``least_loaded`` (the default here, so the study's runs stay as they
    were) is the most-room rule alone."""
    profile: PlacementProfile = DEFAULT_PROFILE
    """Gateway level: the placement plugins (``policies.placement``; the live ``placement.profile``)."""
    route: Callable[[TraceRequest, Sequence[Engine]], int] | None = None
    """Engine level: the engine each arriving request goes to, chosen from what its client sent (a
    router in front of the engines, such as a model of another project's; None: round robin)."""

    def __post_init__(self) -> None:
        if self.level not in (ENGINE, GATEWAY):
            raise ValueError(f"level must be {ENGINE!r} or {GATEWAY!r}, not {self.level!r}")
        if self.level not in self.policy.levels:
            levels = ", ".join(sorted(self.policy.levels))
            raise ValueError(f"policy {self.policy.name!r} runs at {levels} level, not {self.level}")
        if self.engines < 1:
            raise ValueError("engines must be at least 1")
        if self.route is not None and self.level != ENGINE:
            raise ValueError("route places requests at engine level; the gateway level places them itself")


@dataclass
class SimResult:
    records: list[RequestRecord]
    summary: dict[str, float]
    engine_preemptions: list[int]
    mean_in_system: float  # time-averaged number of requests arrived and not finished
    mean_queued: float  # time-averaged number waiting (gateway queue + engine waiting lists)
    wall_s: float
    engine_recomputed_tokens: list[int] = field(default_factory=list)
    """Per engine: tokens preempted requests computed again (their prompt and output less the
    prefix the cache still held when they were re-admitted)."""
    gateway_pauses: int = 0
    """Requests the gateway paused (each pause is one resume)."""
    resumed_tokens: int = 0
    """Tokens paused continuations computed again when they resumed (less their cached prefix)."""


class Simulation:
    """One run. Use :func:`simulate`; this class holds the event loop's state."""

    def __init__(self, workload: Sequence[TraceRequest], setup: SimSetup) -> None:
        self.setup = setup
        self.trace = sorted(workload, key=lambda r: (r.arrival_s, r.rid))
        gateway = setup.level == GATEWAY
        engine_policy: Policy = FCFS() if gateway else setup.policy
        if gateway and setup.engine_rank:
            engine_policy = PriorityPolicy()  # ordering by each request's ``engine_priority``
        engine_cfg = engine_config_for(setup.engine, engine_policy)
        self.engines = [
            Engine(
                setup.perf,
                engine_cfg,
                engine_policy,
                name=f"engine-{i}",
                fold_decode=setup.fold_decode,
                lazy_decode=setup.lazy_decode and not gateway,  # the gateway reads every request's progress
            )
            for i in range(setup.engines)
        ]
        self.policy = setup.policy
        self.gw: SimGateway | None = None
        if gateway:
            self.gw = SimGateway(
                setup.policy,
                setup.admission,
                [e.capacity_tokens for e in self.engines],
                capacity_requests=setup.engine.max_num_seqs * setup.engines,
                limits=setup.queue_limits,
                send=self._send,
                refuse=self._reject,
                pause=setup.pause,
                evict=self._evict,
                placement=setup.placement,
                profile=setup.profile,
                block_size=setup.engine.block_size,
            )
        self.queue: PolicyQueue[EngineRequest] = self.gw.queue if self.gw is not None else PolicyQueue(FCFS())
        """The gateway's queue (always empty at engine level)."""
        self.predictor = None if setup.predictor is None else AtOnce(setup.predictor)
        self.records: dict[int, RequestRecord] = {}
        self.asked: dict[EngineRequest, Asked] = {}
        """What the predictor was asked about each request and answered (it is told the outcome under
        the same query, with what it kept from its answer)."""
        self.steps: list[SchedulerOutput | None] = [None] * len(self.engines)
        self.events: list[tuple[float, int, int]] = []  # (time, seq, engine) step ends
        self.seq = 0
        self.rr = 0
        self.next_arrival = 0
        self.now = 0.0
        self.in_system = 0
        self.area_system = 0.0
        self.area_queued = 0.0
        self.progress_hook = Capability.PROGRESS_HOOK in setup.policy.capabilities
        # No fold while the gateway queue holds work, wherever a pass may act on progress at any step:
        # a projected peak falls as requests progress, and a pause reads every running request.
        pause = self.gw.dispatch_loop.pause if self.gw is not None else None
        pausing = pause is not None and pause.enabled  # (a band's pause waits for an unfolded pass)
        self.peak_rule = gateway and (setup.admission.rule == "peak" or pausing)

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        trace, events = self.trace, self.events
        while self.next_arrival < len(trace) or events:
            t_arr = trace[self.next_arrival].arrival_s if self.next_arrival < len(trace) else float("inf")
            if events and events[0][0] <= t_arr:
                t, _, idx = heapq.heappop(events)
                self._advance(t)
                self._step_end(idx)
            else:
                self._advance(t_arr)
                self._arrive(trace[self.next_arrival])
                self.next_arrival += 1
        stuck = [r for r in self.records.values() if r.status == "ok" and r.finish_s is None]
        if stuck:
            raise RuntimeError(f"simulation ended with {len(stuck)} unfinished requests")
        recs = [self.records[r.rid] for r in self.trace]
        span = max(self.now, 1e-12)
        return SimResult(
            records=recs,
            summary=summarize(recs),
            engine_preemptions=[e.num_preemptions for e in self.engines],
            mean_in_system=self.area_system / span,
            mean_queued=self.area_queued / span,
            wall_s=time.perf_counter() - t0,
            engine_recomputed_tokens=[e.recomputed_tokens for e in self.engines],
            gateway_pauses=sum(e.num_pauses for e in self.engines),
            resumed_tokens=sum(e.resumed_tokens for e in self.engines),
        )

    def _advance(self, t: float) -> None:
        if t < self.now:
            raise AssertionError("simulated time ran backwards")
        dt = t - self.now
        if dt:
            self.area_system += self.in_system * dt
            queued = len(self.queue) + sum([len(e.waiting) for e in self.engines])
            self.area_queued += queued * dt
        self.now = t

    # --- arrivals -----------------------------------------------------------------------------
    def _arrive(self, tr: TraceRequest) -> None:
        now = self.now
        setup = self.setup
        asked: Asked | None = None
        pred = None
        if self.predictor is not None:
            query = PredictionQuery.of(tr)
            asked = Asked(query, self.predictor.predict(query))
            pred = asked.prediction.distribution
        if pred is not None and setup.cap_at_max_tokens:
            pred = pred.capped(tr.max_tokens)
        req = EngineRequest(
            tr.rid,
            tr.arrival_s,
            tr.prompt_tokens,
            tr.output_tokens,
            hash_ids=tr.hash_ids,
            prompt=tr.prompt,
            tenant=tr.tenant,
            priority=tr.priority,
            deadline_s=tr.deadline_s,
            prediction=pred,
            true_output=tr.output_tokens,
        )
        rec = RequestRecord(
            rid=tr.rid,
            arrival_s=tr.arrival_s,
            prompt_tokens=tr.prompt_tokens,
            output_tokens=0,
            predicted_mean=None if pred is None else pred.mean,
            tenant=tr.tenant,
            deadline_s=tr.deadline_s,
        )
        self.records[tr.rid] = rec
        if asked is not None:
            self.asked[req] = asked
        # A backend refuses prompt + the client's cap beyond its context, as vLLM does.
        if tr.prompt_tokens + max(tr.output_tokens, tr.max_tokens or 0) > self.engines[0].capacity_tokens:
            rec.status, rec.reason = "rejected", "context_too_long"
            return
        gw = self.gw
        if gw is not None:
            full = gw.full_reason(req)
            if full is not None:
                rec.status, rec.reason = "rejected", full
                return
        self.in_system += 1
        if gw is not None:
            gw.enqueue(req, now)
            gw.dispatch(now, self.engines)
        elif setup.route is not None:
            self._send(req, setup.route(tr, self.engines))
        else:
            idx = self.rr
            self.rr = (self.rr + 1) % len(self.engines)
            self._send(req, idx)

    def _send(self, req: EngineRequest, idx: int) -> None:
        if not req.pauses:  # a resumed continuation keeps its first dispatch
            req.t_dispatch = self.now
            self.records[req.rid].dispatch_s = self.now
        if self.setup.engine_rank and self.gw is not None:  # sent with its rank as its priority
            req.engine_priority = engine_priority(self.policy.engine_rank(req), req.priority)
        req.backend = idx
        self.engines[idx].add(req, self.now)
        self._kick(idx)

    def _evict(self, req: EngineRequest) -> bool:
        """The gateway paused ``req``: off its engine at once (the step in flight drops it)."""
        idx = req.backend
        return self.engines[idx].pause(req, self.now, self.steps[idx])

    # --- the gateway ---------------------------------------------------------------------------
    def _reject(self, req: EngineRequest, reason: str) -> None:
        """The gateway refused ``req`` for good (the policy has been told)."""
        rec = self.records[req.rid]
        rec.status, rec.reason = "rejected", reason
        self.in_system -= 1

    # --- engines ------------------------------------------------------------------------------
    def _kick(self, idx: int) -> None:
        """Start engine ``idx``'s next step if it is idle and has work."""
        if self.steps[idx] is not None:
            return
        eng = self.engines[idx]
        if not eng.has_work():
            return
        step = eng.schedule(self.now, self._fold_horizon())
        if not step.scheduled and not step.cohort:
            raise AssertionError(f"{eng.name} has work but scheduled nothing")
        self.steps[idx] = step
        self.seq += 1
        heapq.heappush(self.events, (self.now + step.duration, self.seq, idx))

    def _fold_horizon(self) -> float:
        """Until when an engine may fold decode steps into one event: the next arrival."""
        if self.peak_rule and self.queue:
            # A projected peak falls as requests progress, so the head may fit after any step.
            return self.now
        nxt = self.next_arrival
        return self.trace[nxt].arrival_s if nxt < len(self.trace) else float("inf")

    def _step_end(self, idx: int) -> None:
        step = self.steps[idx]
        assert step is not None
        self.steps[idx] = None
        now = self.now
        out = self.engines[idx].complete(step, now)
        records = self.records
        gw = self.gw
        for req in out.first:
            records[req.rid].first_token_s = req.t_first_token
            if gw is not None:
                gw.started(req)
        if gw is not None:
            gw.progressed(out.emitted)
            if self.progress_hook:
                on_progress, k = self.policy.on_progress, step.k
                for req in out.emitted:
                    on_progress(req, k, now)
        for req in out.finished:
            self._finish(req)
        if gw is not None:
            gw.dispatch(now, self.engines)
        self._kick(idx)

    def _finish(self, req: EngineRequest) -> None:
        rec = self.records[req.rid]
        rec.finish_s = req.t_finish
        rec.output_tokens = req.generated
        rec.preemptions = req.preemptions
        rec.backend = self.engines[req.backend].name
        rec.cached_tokens = req.cached_tokens
        self.in_system -= 1
        asked = self.asked.pop(req, None)
        if self.predictor is not None and asked is not None:
            self.predictor.observe(asked.query, req.generated, asked.prediction.memo)
        if self.gw is not None:
            self.gw.finish(req, self.now)


def engine_config_for(cfg: EngineConfig, policy: EngineKnobs) -> EngineConfig:
    """The engine settings with an engine-variant policy's variant and chunk budget applied."""
    changes: dict[str, object] = {}
    if policy.engine_variant is not None:
        changes["variant"] = policy.engine_variant
    if policy.engine_chunk_size is not None:
        changes["chunk_size"] = policy.engine_chunk_size
        if policy.engine_variant in (None, "v1"):
            changes["max_num_batched_tokens"] = policy.engine_chunk_size
    return dataclasses.replace(cfg, **changes) if changes else cfg  # type: ignore[arg-type]


def simulate(workload: Sequence[TraceRequest], setup: SimSetup) -> SimResult:
    """Run ``workload`` through ``setup``; one record per request, in arrival order."""
    return Simulation(workload, setup).run()


def client_view(result: SimResult, frontend_s: float) -> None:
    """Add the front end's fixed cost (tokenisation, HTTP) to what a client sees: first token and
    completion both arrive ``frontend_s`` later."""
    for r in result.records:
        if r.first_token_s is not None:
            r.first_token_s += frontend_s
        if r.finish_s is not None:
            r.finish_s += frontend_s
    result.summary = summarize(result.records)
