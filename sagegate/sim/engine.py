"""One vLLM-like engine: its scheduler and its steps, on whatever clock the caller keeps.

The caller (the discrete-event simulator, or the simulated backend server on a real clock) asks
:meth:`Engine.schedule` for the next step at ``now``; the returned
:class:`~sim.step_output.SchedulerOutput` lasts ``duration`` seconds; then :meth:`Engine.complete`
applies it at ``now + duration`` and says, in a :class:`~sim.step_output.StepOutcome`, which requests
produced tokens and which finished. ``schedule`` reads top to bottom like vLLM v1's scheduler:
running requests first (each gets its next chunk or its one decode token), preempting by recompute
when the KV pool runs dry, then waiting requests in queue order while budget, sequence cap and
blocks allow; then the step is timed, folding identical decode steps where that is exact
(:mod:`sim.step_timing`). Where nothing reads a running request between steps, the decoding ones
advance together as one cohort, unvisited (:mod:`sim.decode_cohort`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from sagegate.policies.base import Capability
from sagegate.policies.fifo import FCFS
from sagegate.policies.interfaces import EnginePolicy
from sagegate.policies.queue import PolicyQueue
from sagegate.sim.config import EngineConfig
from sagegate.sim.decode_cohort import DecodeCohort
from sagegate.sim.engine_request import ABORTED, FINISHED, PREEMPTED, RUNNING, WAITING, EngineRequest
from sagegate.sim.kv import BlockPool
from sagegate.sim.perf import PerfModel
from sagegate.sim.preemption import preempt_for_waiting
from sagegate.sim.prefix import BlockKeys, block_keys
from sagegate.sim.step_apply import apply_step
from sagegate.sim.step_output import SchedulerOutput, StepOutcome
from sagegate.sim.step_timing import Batch, fold_is_exact, split_batch, time_step

_READS_RUNNING = frozenset(
    {Capability.PROGRESS_HOOK, Capability.REKEY_ON_PROGRESS, Capability.DEFER_DECODE, Capability.PREEMPT}
)
"""Policies that read running requests' progress between steps: no decode cohort for them."""


class Engine:
    """A vLLM-like engine: scheduler, paged KV pool with prefix caching, roofline step times.

    ``policy`` orders the waiting queue and picks preemption victims (vLLM's priority mode); the
    default, FCFS, is vLLM's default: preempted requests rejoin at the head, the victim is the last
    running request.
    """

    def __init__(
        self,
        perf: PerfModel,
        config: EngineConfig | None = None,
        policy: EnginePolicy | None = None,
        *,
        name: str = "engine-0",
        on_preempt: Callable[[EngineRequest], None] | None = None,
        fold_decode: bool = True,
        lazy_decode: bool = False,
    ) -> None:
        self.perf = perf
        self.config = config = config or EngineConfig()
        self.policy: EnginePolicy = policy or FCFS()
        self.fcfs = Capability.ARRIVAL_ORDER in self.policy.capabilities
        self.name = name
        blocks = config.num_gpu_blocks_override or perf.num_gpu_blocks(
            config.block_size, config.gpu_memory_utilization
        )
        self.pool = BlockPool(blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: PolicyQueue[EngineRequest] = PolicyQueue(self.policy)
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0
        self.recomputed_tokens = 0  # tokens preempted requests computed again on re-admission
        self.num_pauses = 0  # requests the gateway paused here
        self.resumed_tokens = 0  # tokens paused continuations computed again on resume
        self.prompt_tokens_total = 0
        self.prefix_queries_tokens = 0
        """Tokens of the requests admitted, each looked up in the prefix cache: vLLM's
        ``vllm:prefix_cache_queries``. A preempted request's lookup on re-admission is left out, as vLLM
        leaves it out (it books it as ``preempted_queries``, which its /metrics does not export): its
        own blocks found again are not a hit a router earned."""
        self.prefix_hits_tokens = 0
        """Of those, the tokens found cached (not computed again): ``vllm:prefix_cache_hits``."""
        self.generation_tokens_total = 0
        self.finished_total = 0
        self._on_preempt = on_preempt
        self.fold_decode = fold_decode
        self._progress_hook = Capability.PROGRESS_HOOK in self.policy.capabilities
        self.cohort: DecodeCohort | None = None
        """Decoding requests advanced together (``sim.decode_cohort``): with ``lazy_decode``, which a
        driver asks for when it reads no request's progress between steps (``StepOutcome.emitted``
        then leaves the cohort out), and where nothing else does: vLLM v1's scheduler and a policy
        that neither hears of progress nor re-keys or displaces running requests."""
        if lazy_decode and config.variant == "v1" and not self.policy.capabilities & _READS_RUNNING:
            self.cohort = DecodeCohort(config.block_size)

    # --- public state -------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def waiting_tokens(self) -> int:
        """Tokens the waiting requests still have to compute (prompt, plus output after preemption)."""
        return sum(r.prompt_tokens + r.generated for r in self.waiting)

    @property
    def prefix_hit_ratio(self) -> float:
        """The share of admitted tokens the prefix cache has served so far (``vllm:prefix_cache_hits``
        over ``queries``)."""
        return self.prefix_hits_tokens / self.prefix_queries_tokens if self.prefix_queries_tokens else 0.0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks held by requests (vLLM's ``kv_cache_usage_perc``; cached free blocks
        are free)."""
        return self.pool.usage

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.pool.block_size

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def check_invariants(self) -> None:
        """Raise AssertionError if the KV accounting is inconsistent (tests call this every step)."""
        pool = self.pool
        if self.cohort is not None:
            self.cohort.sync_all(self.running)
        assert 0 <= pool.free_blocks <= pool.num_blocks, "free blocks out of range"
        held = sum(r.table.nblocks for r in self.running)
        shared = sum(1 for r in self.running for k in r.table.keys if k is not None)
        in_use_cached = pool.cached_in_use
        assert pool.used_blocks == held - shared + in_use_cached, "blocks leaked or double-counted"
        for r in self.running:
            assert r.state is RUNNING, "a running request not in the running state"
            assert r.table.nblocks * pool.block_size >= r.num_computed, "computed tokens without blocks"
        for r in self.waiting:
            assert r.state.is_queued, "a waiting request not in a queued state"
            assert r.table.nblocks == 0, "a waiting request holds blocks"

    # --- requests in and out ------------------------------------------------------------------
    def add(self, req: EngineRequest, now: float) -> None:
        req.t_engine = now
        req.state = WAITING
        self.policy.on_arrival(req, now)
        self.waiting.push(req, now)

    def _cache_output(self, req: EngineRequest) -> None:
        """Before its blocks are freed: cache the full blocks its output filled, where their content
        is known (``sim.prefix.block_keys``'s ``content_tokens``; a no-op for a prompt-only key)."""
        keys = req.keys
        if isinstance(keys, BlockKeys) and keys.shared_blocks > len(req.table.keys):
            bs = self.pool.block_size
            self.pool.register_full(req.table, min(req.num_computed, keys.shared_blocks * bs), keys)

    def abort(self, req: EngineRequest, now: float) -> bool:
        """Cancel ``req`` (client gone): its blocks are freed at once. False if it had finished."""
        if req.state is RUNNING:
            self._leave_cohort(req)
            self.running.remove(req)
            self._cache_output(req)
            self.pool.free(req.table)
        elif req.state.is_queued:
            self.waiting.remove(req)
        else:
            return False
        req.state = ABORTED
        self.policy.on_finish(req, now)
        return True

    def pause(self, req: EngineRequest, now: float, in_flight: SchedulerOutput | None) -> bool:
        """The gateway paused running ``req``: it leaves at once, its computed blocks staying cached
        (as a preemption's do) for its continuation to find, and the step ``in_flight`` (the one
        this engine is running) drops it. False if it is not running."""
        if req.state is not RUNNING:
            return False
        if (
            in_flight is not None
            and in_flight.scheduled.pop(req, None) is not None
            and req in in_flight.chunked
        ):
            in_flight.chunked.remove(req)
        self._leave_cohort(req)
        self.running.remove(req)
        self.pool.register_full(req.table, req.num_computed, req.keys)
        self.pool.free(req.table)
        req.num_computed = 0
        req.state = ABORTED  # until ``add`` queues the continuation
        self.num_pauses += 1
        self.policy.on_finish(req, now)
        return True

    def _leave_cohort(self, req: EngineRequest) -> None:
        if req.cohort_tick >= 0:
            assert self.cohort is not None
            self.cohort.leave(req)

    # --- scheduling ---------------------------------------------------------------------------
    def schedule(self, now: float, horizon: float = float("inf")) -> SchedulerOutput:
        """Decide and time the next step at ``now``. A folded decode step never runs past
        ``horizon`` (the next outside event: an arrival for this engine)."""
        preemptions_before = self.num_preemptions
        variant = self.config.variant
        scheduled: dict[EngineRequest, int] = {}
        if variant == "v0":
            self._schedule_v0(now, scheduled)
            batch = None
        else:
            batch = self._schedule_chunked(now, scheduled, decode_first=variant == "sarathi")
        preempted = self.num_preemptions - preemptions_before
        cohort = self.cohort
        lazy = cohort.size if cohort is not None and cohort.pending else 0  # members decoding unvisited
        if not scheduled and not lazy:
            return SchedulerOutput(now, 0.0, scheduled, 1, preempted, [])
        if batch is None:  # a preemption took an already scheduled request back out: classify anew
            assert not lazy, "a step with decode cohort members never preempts"
            batch = Batch.of(scheduled)
        foldable = (
            self.fold_decode
            and not batch.prefill
            and fold_is_exact(
                self.policy, preempted, len(scheduled) + lazy, len(self.running), bool(self.waiting)
            )
        )
        members = cohort if lazy else None
        duration, k = time_step(self.perf, self.pool, batch, scheduled, horizon - now, foldable, members)
        if members is not None:
            members.pending = k
        return SchedulerOutput(now, duration, scheduled, k, preempted, batch.chunked, lazy)

    def _schedule_chunked(
        self, now: float, sched: dict[EngineRequest, int], *, decode_first: bool
    ) -> Batch | None:
        """vLLM v1 (or Sarathi, decodes first): fill ``sched``; returns its batch, gathered on the
        way (None when a preemption took an already scheduled request back out)."""
        cfg = self.config
        budget = cfg.chunk_size if decode_first else cfg.max_num_batched_tokens
        if Capability.PREEMPT in self.policy.capabilities and self.waiting:
            # Preemptions the policy chose to make room for a better request do not stop admission
            # (only running out of memory mid-step does, as in vLLM).
            preempt_for_waiting(self, now)
        preemptions_before = self.num_preemptions
        order = self.running
        n_dec = ctx = 0
        cohort = self.cohort
        if cohort is not None and (members := cohort.start_step(order, budget, self.pool)):
            # The members lead the list and each decodes a token: visit only the tail.
            n_dec, ctx = members, cohort.context
            budget -= members
            order = order[members:]
        if decode_first:
            # decodes first
            order = sorted(order, key=lambda r: r.num_computed + 1 < r.prompt_tokens + r.generated)
        elif Capability.REKEY_ON_PROGRESS in self.policy.capabilities and self._budget_binds(budget):
            # Order only matters when the budget cannot cover everyone running.
            order = sorted(order, key=lambda r: self.policy.key(r, now))
        defer = Capability.DEFER_DECODE in self.policy.capabilities
        bs = self.pool.block_size
        prefill: list[tuple[int, int]] = []
        chunked: list[EngineRequest] = []
        for req in order if order is not self.running else list(order):
            if budget <= 0:
                break
            if req.state is not RUNNING:
                continue  # preempted as a victim earlier in this loop
            generated = req.generated
            computed = req.num_computed
            todo = req.prompt_tokens + generated - computed
            if defer and todo == 1 and generated and self.policy.defer_decode(req, now):
                continue
            n = todo if todo < budget else budget
            if computed + n > req.table.nblocks * bs:
                ok, freed = self._grow_or_preempt(req, computed + n, sched, now)
                budget += freed
                if not ok:
                    continue
            sched[req] = n
            budget -= n
            if todo == 1 and generated:  # a decode (``split_batch``'s test: n == 1 follows)
                n_dec += 1
                ctx += computed
            else:
                prefill.append((n, computed))
                chunked.append(req)
        if self.num_preemptions != preemptions_before:
            return None  # out of memory mid-step: no admission (vLLM), and the batch is stale
        before = len(sched)
        self._admit(now, sched, budget)
        if len(sched) != before:
            d, c = split_batch(itertools.islice(sched.items(), before, None), prefill, chunked)
            n_dec += d
            ctx += c
        return Batch(prefill, chunked, n_dec, ctx)

    def _budget_binds(self, budget: int) -> bool:
        """Would the running requests' next tokens exceed ``budget``?"""
        need = 0
        for r in self.running:
            need += r.prompt_tokens + r.generated - r.num_computed
            if need > budget:
                return True
        return False

    def _schedule_v0(self, now: float, sched: dict[EngineRequest, int]) -> None:
        """vLLM v0: admit whole prompts (prefill-only step) when any fit, else decode everyone."""
        budget = self.config.max_num_batched_tokens
        if self.waiting:
            self._admit(now, sched, budget, whole_prompts=True)
            if sched:
                return
        for req in list(self.running):
            if req.state is not RUNNING:
                continue
            ok, _ = self._grow_or_preempt(req, req.num_computed + 1, sched, now)
            if ok:
                sched[req] = 1

    def _grow_or_preempt(
        self, req: EngineRequest, tokens: int, sched: dict[EngineRequest, int], now: float
    ) -> tuple[bool, int]:
        """Give ``req`` blocks for ``tokens`` tokens, preempting victims while the pool is short.
        Returns whether ``req`` still runs, and the token budget given back by victims that had
        already been scheduled in this step."""
        freed = 0
        while not self.pool.grow(req.table, tokens):
            victim = self._victim(now)
            freed += sched.pop(victim, 0)
            self.preempt(victim, now)
            if victim is req:
                return False, freed
        return True, freed

    def _admit(
        self, now: float, sched: dict[EngineRequest, int], budget: int, *, whole_prompts: bool = False
    ) -> None:
        """Admit waiting requests in queue order while budget, sequence cap and blocks allow; stop at
        the first that does not fit (vLLM does not skip ahead)."""
        pool = self.pool
        bs = pool.block_size
        whole_sequence = whole_prompts or self.config.scheduler_reserve_full_isl  # must fit to start
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.peek(now)
            assert req is not None
            keys = req.keys
            if not isinstance(keys, BlockKeys):
                keys = req.keys = block_keys(req.rid, req.prompt_tokens, bs, *keys)
            total = req.prompt_tokens + req.generated
            # A bound first, so a head that cannot fit is not scanned for cached blocks step after
            # step: it needs a block for every token it computes, and a cached block it revives
            # costs one too, except a shared-content block that another request holds.
            floor = -(-total // bs) - keys.shared_blocks
            if not whole_sequence:
                floor = min(floor, -(-budget // bs))  # a chunk of ``budget`` tokens, after its hits
            if floor > pool.free_blocks:
                break
            # The last known token is always computed: it yields the next token's logits.
            most = (total - 1) // bs
            hits, revived = pool.prefix_hits(keys, most)
            computed = len(hits) * bs
            n = total - computed
            if whole_prompts:
                if n > budget and sched:
                    break
            else:
                n = min(n, budget)
            if not pool.fits(revived, -(-(total if whole_sequence else computed + n) // bs) - len(hits)):
                break
            self.waiting.pop(now)
            if req.state is PREEMPTED:
                self.recomputed_tokens += total - computed
            else:  # vLLM's exported prefix counters and a request's cached tokens: first admissions
                self.prefix_queries_tokens += total
                self.prefix_hits_tokens += computed
                req.cached_tokens = max(req.cached_tokens, computed)
                if req.generated:  # a paused continuation resuming (a new request to the engine)
                    self.resumed_tokens += total - computed
            pool.take(req.table, hits)
            pool.grow(req.table, computed + n)
            req.num_computed = computed
            req.state = RUNNING
            self.running.append(req)
            self.policy.on_dispatch(req, now)
            sched[req] = n
            budget -= n

    # --- preemption ---------------------------------------------------------------------------
    def _victim(self, now: float) -> EngineRequest:
        if self.fcfs:
            return self.running[-1]
        victim = self.policy.pick_victim(self.running, now)
        assert isinstance(victim, EngineRequest)
        return victim

    def preempt(self, victim: EngineRequest, now: float) -> None:
        """Preemption by recompute: the victim loses its blocks and computed tokens and waits again."""
        assert victim.cohort_tick < 0, "a decode cohort member preempted (the cohort dissolves first)"
        self.running.remove(victim)
        # Its computed blocks stay cached (private ones too): recomputing it may find them again.
        self.pool.register_full(victim.table, victim.num_computed, victim.keys)
        self.pool.free(victim.table)
        victim.num_computed = 0
        victim.state = PREEMPTED
        victim.preemptions += 1
        self.num_preemptions += 1
        self.policy.on_preempt(victim, now)
        self.waiting.push(victim, now)
        if self._on_preempt is not None:
            self._on_preempt(victim)

    # --- applying a step ----------------------------------------------------------------------
    def complete(self, step: SchedulerOutput, now: float) -> StepOutcome:
        """Apply ``step`` at its end time ``now``: advance every scheduled request, emit tokens,
        finish and free the completed ones."""
        policy = self.policy
        out = apply_step(step, now, self.pool, policy.on_progress if self._progress_hook else None)
        for req in out.first:
            self.prompt_tokens_total += req.prompt_tokens
        emitted = len(out.emitted)
        cohort = self.cohort
        if cohort is not None and step.cohort:
            emitted += cohort.size  # (less any that left while the step ran)
            done = cohort.end_step(step.k)
            if done:  # they lead the running list, so the schedule's order has them first
                out.finished = done + out.finished
        self.generation_tokens_total += step.k * emitted
        pool = self.pool
        for req in out.finished:
            req.state = FINISHED
            req.t_finish = now
            self.running.remove(req)
            self._cache_output(req)
            pool.free(req.table)
            self.finished_total += 1
            policy.on_finish(req, now)
        if cohort is not None:
            cohort.take_in(self.running, out.emitted)
        return out
