"""One vLLM-like engine: its scheduler and its steps, on whatever clock the caller keeps.

The caller (the discrete-event simulator, or the simulated backend server on a real clock) asks
:meth:`Engine.plan` for the next step at ``now``; the step lasts ``Step.duration`` seconds; then
:meth:`Engine.complete` applies it at ``now + duration`` and says which requests produced tokens and
which finished. ``plan`` reads top to bottom like vLLM v1's scheduler: running requests first (each
gets its next chunk or its one decode token), preempting by recompute when the KV pool runs dry, then
waiting requests in queue order while budget, sequence cap and blocks allow.

Where a step changes nothing but the decode position (every running request decoding, nobody to
admit), ``plan`` may fold ``k`` identical decode steps into one macro step, timed in closed form.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from policies.base import Capability, Policy, SchedRequest
from policies.fifo import FCFS
from policies.queue import PolicyQueue
from sim.config import EngineConfig
from sim.kv import BlockPool, BlockTable
from sim.perf import PerfModel
from sim.prefix import BlockKeys, block_keys

WAITING, RUNNING, FINISHED, ABORTED = 0, 1, 2, 3

_Batch = tuple[list[tuple[int, int]], list["EngineRequest"], int, int]
"""A step's batch for timing: prefill chunks ``(c, p)``, their requests, decodes, decode context."""


def _split_batch(
    items: Iterable[tuple[EngineRequest, int]],
    prefill: list[tuple[int, int]],
    chunked: list[EngineRequest],
) -> tuple[int, int]:
    """Sort scheduled ``(request, tokens)`` pairs into decodes and prefill chunks: chunks are appended
    to ``prefill`` (as ``(tokens, computed)``) and ``chunked``; returns the decodes' count and context."""
    n_dec = ctx = 0
    for req, n in items:
        if n == 1 and req.generated and req.num_computed + 1 == req.prompt_tokens + req.generated:
            n_dec += 1
            ctx += req.num_computed
        else:
            prefill.append((n, req.num_computed))
            chunked.append(req)
    return n_dec, ctx


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


class EngineRequest(SchedRequest):
    """A request inside an engine: what the policy sees plus the engine's own progress."""

    __slots__ = (
        "backend",
        "cached_tokens",
        "keys",
        "num_computed",
        "output_tokens",
        "preemptions",
        "state",
        "t_dispatch",
        "t_engine",
        "t_finish",
        "t_first_token",
        "table",
        "user",
    )

    def __init__(
        self,
        rid: Any,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        *,
        hash_ids: tuple[int, ...] | None = None,
        prompt: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(rid, arrival_s, prompt_tokens, **kw)
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        self.output_tokens = output_tokens
        self.num_computed = 0
        self.table = BlockTable()
        self.keys: BlockKeys | Any = (hash_ids, prompt)  # resolved to BlockKeys on first admission
        self.state = WAITING
        self.preemptions = 0
        self.cached_tokens = 0
        self.t_dispatch = arrival_s
        self.t_engine = arrival_s
        self.t_first_token: float | None = None
        self.t_finish: float | None = None
        self.backend = 0
        self.user: Any = None  # the driver's own handle (e.g. the server's token channel)

    @property
    def known_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold before the next token."""
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class Step:
    """A planned step (or ``k`` folded decode steps): who runs how many tokens, and how long."""

    start: float
    duration: float
    scheduled: dict[EngineRequest, int] = field(default_factory=dict)
    k: int = 1  # decode steps folded into this one (then every scheduled request decodes k tokens)
    preempted: int = 0
    chunked: list[EngineRequest] | None = None
    """The scheduled requests with a prefill chunk (not one decode token), in schedule order; set
    when the step is timed (None: not classified)."""


@dataclass(slots=True)
class StepOutcome:
    emitted: list[EngineRequest]  # produced ≥ 1 token this step (k tokens each for a folded step)
    finished: list[EngineRequest]
    first: list[EngineRequest] = field(default_factory=list)  # of ``emitted``, those whose first token it was


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
        policy: Policy | None = None,
        *,
        name: str = "engine-0",
        on_preempt: Callable[[EngineRequest], None] | None = None,
        fold_decode: bool = True,
    ) -> None:
        self.perf = perf
        self.config = config = config or EngineConfig()
        self.policy = policy or FCFS()
        self.fcfs = Capability.ARRIVAL_ORDER in self.policy.capabilities
        self.name = name
        blocks = config.num_gpu_blocks_override or perf.num_gpu_blocks(
            config.block_size, config.gpu_memory_utilization
        )
        self.pool = BlockPool(blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: PolicyQueue[EngineRequest] = PolicyQueue(self.policy)
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0
        self._on_preempt = on_preempt
        self.fold_decode = fold_decode
        self._progress_hook = Capability.PROGRESS_HOOK in self.policy.capabilities

    # --- public state -------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def waiting_tokens(self) -> int:
        """Tokens the waiting requests still have to compute (prompt, plus output after preemption)."""
        return sum(r.prompt_tokens + r.generated for r in self.waiting)

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
        assert 0 <= pool.free_blocks <= pool.num_blocks, "free blocks out of range"
        held = sum(r.table.nblocks for r in self.running)
        shared = sum(1 for r in self.running for k in r.table.keys if k is not None)
        in_use_cached = pool.cached_in_use
        assert pool.used_blocks == held - shared + in_use_cached, "blocks leaked or double-counted"
        for r in self.running:
            assert r.table.nblocks * pool.block_size >= r.num_computed, "computed tokens without blocks"
        for r in self.waiting:
            assert r.table.nblocks == 0, "a waiting request holds blocks"

    # --- requests in and out ------------------------------------------------------------------
    def add(self, req: EngineRequest, now: float) -> None:
        req.t_engine = now
        req.state = WAITING
        self.policy.on_arrival(req, now)
        self.waiting.push(req, now)

    def abort(self, req: EngineRequest, now: float) -> bool:
        """Cancel ``req`` (client gone): its blocks are freed at once. False if it had finished."""
        if req.state == RUNNING:
            self.running.remove(req)
            self.pool.free(req.table)
        elif req.state == WAITING:
            self.waiting.remove(req)
        else:
            return False
        req.state = ABORTED
        self.policy.on_finish(req, now)
        return True

    # --- scheduling ---------------------------------------------------------------------------
    def plan(self, now: float, horizon: float = float("inf")) -> Step:
        """Decide the next step at ``now``. A folded decode step never runs past ``horizon`` (the
        next outside event: an arrival for this engine)."""
        variant = self.config.variant
        if variant == "v0":
            step, batch = self._plan_v0(now), None
        else:
            step, batch = self._plan_chunked(now, decode_first=variant == "sarathi")
        if step.scheduled:
            self._time(step, horizon, batch)
        return step

    def _plan_chunked(self, now: float, *, decode_first: bool) -> tuple[Step, _Batch | None]:
        """The step, and its batch as :meth:`_time` reads it, gathered on the way (None when a
        preemption took an already scheduled request back out)."""
        cfg = self.config
        budget = cfg.chunk_size if decode_first else cfg.max_num_batched_tokens
        step = Step(now, 0.0)
        sched = step.scheduled
        displaced = 0
        if Capability.PREEMPT in self.policy.capabilities and self.waiting:
            # Preemptions the policy chose to make room for a better request do not stop admission
            # (only running out of memory mid-step does, as in vLLM).
            displaced = self._preempt_for_waiting(now)
        order = self.running
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
        n_dec = ctx = 0
        for req in order if order is not self.running else list(order):
            if budget <= 0:
                break
            if req.state != RUNNING:
                continue  # preempted as a victim earlier in this loop
            generated = req.generated
            computed = req.num_computed
            todo = req.prompt_tokens + generated - computed
            if defer and todo == 1 and generated and self.policy.defer_decode(req, now):
                continue
            n = todo if todo < budget else budget
            if computed + n > req.table.nblocks * bs:
                ok, freed = self._grow_or_preempt(req, computed + n, step)
                budget += freed
                if not ok:
                    continue
            sched[req] = n
            budget -= n
            if todo == 1 and generated:  # a decode (``_time``'s test: n == 1 follows)
                n_dec += 1
                ctx += computed
            else:
                prefill.append((n, computed))
                chunked.append(req)
        batch: _Batch | None = None
        if not step.preempted:
            before = len(sched)
            self._admit(now, step, budget)
            d, c = _split_batch(itertools.islice(sched.items(), before, None), prefill, chunked)
            batch = (prefill, chunked, n_dec + d, ctx + c)
        step.preempted += displaced
        return step, batch

    def _budget_binds(self, budget: int) -> bool:
        """Would the running requests' next tokens exceed ``budget``?"""
        need = 0
        for r in self.running:
            need += r.prompt_tokens + r.generated - r.num_computed
            if need > budget:
                return True
        return False

    def _plan_v0(self, now: float) -> Step:
        """vLLM v0: admit whole prompts (prefill-only step) when any fit, else decode everyone."""
        step = Step(now, 0.0)
        budget = self.config.max_num_batched_tokens
        if self.waiting:
            self._admit(now, step, budget, whole_prompts=True)
            if step.scheduled:
                return step
        for req in list(self.running):
            if req.state != RUNNING:
                continue
            ok, _ = self._grow_or_preempt(req, req.num_computed + 1, step)
            if ok:
                step.scheduled[req] = 1
        return step

    def _grow_or_preempt(self, req: EngineRequest, tokens: int, step: Step) -> tuple[bool, int]:
        """Give ``req`` blocks for ``tokens`` tokens, preempting victims while the pool is short.
        Returns whether ``req`` still runs, and the token budget given back by victims that had
        already been scheduled in this step."""
        freed = 0
        while not self.pool.grow(req.table, tokens):
            victim = self._victim(step.start)
            freed += step.scheduled.pop(victim, 0)
            self._preempt(victim, step.start)
            step.preempted += 1
            if victim is req:
                return False, freed
        return True, freed

    def _admit(self, now: float, step: Step, budget: int, *, whole_prompts: bool = False) -> None:
        """Admit waiting requests in queue order while budget, sequence cap and blocks allow; stop at
        the first that does not fit (vLLM does not skip ahead)."""
        pool = self.pool
        bs = pool.block_size
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
            if not whole_prompts:
                floor = min(floor, -(-budget // bs))  # a chunk of ``budget`` tokens, after its hits
            if floor > pool.free_blocks:
                break
            # The last known token is always computed: it yields the next token's logits.
            most = (total - 1) // bs
            hits, revived = pool.prefix_hits(keys, most)
            computed = len(hits) * bs
            n = total - computed
            if whole_prompts:
                if n > budget and step.scheduled:
                    break
            else:
                n = min(n, budget)
            if not pool.fits(revived, -(-(computed + n) // bs) - len(hits)):
                break
            self.waiting.pop(now)
            pool.take(req.table, hits)
            pool.grow(req.table, computed + n)
            req.num_computed = computed
            req.cached_tokens = max(req.cached_tokens, computed)
            req.state = RUNNING
            self.running.append(req)
            self.policy.on_dispatch(req, now)
            step.scheduled[req] = n
            budget -= n

    def _victim(self, now: float) -> EngineRequest:
        if self.fcfs:
            return self.running[-1]
        victim = self.policy.pick_victim(self.running, now)
        assert isinstance(victim, EngineRequest)
        return victim

    def _preempt(self, victim: EngineRequest, now: float) -> None:
        """Preemption by recompute: the victim loses its blocks and computed tokens and waits again."""
        self.running.remove(victim)
        # Its computed blocks stay cached (private ones too): recomputing it may find them again.
        self.pool.register_full(victim.table, victim.num_computed, victim.keys)
        self.pool.free(victim.table)
        victim.num_computed = 0
        victim.state = WAITING
        victim.preemptions += 1
        self.num_preemptions += 1
        self.policy.on_preempt(victim, now)
        self.waiting.push(victim, now)
        if self._on_preempt is not None:
            self._on_preempt(victim)

    def _preempt_for_waiting(self, now: float) -> int:
        """Preemptive policies: displace the worst running requests while a better one waits and
        cannot get in (sequence cap or blocks), within the policy's per-step share."""
        policy = self.policy
        limit = max(1, int(policy.max_preempt_share * len(self.running)))
        done = 0
        while done < limit and self.running:
            best = self.waiting.peek(now)
            assert best is not None
            need = self.pool.blocks_for(best.known_tokens)
            full = len(self.running) >= self.config.max_num_seqs or need > self.pool.free_blocks
            if not full:
                break
            best_key = policy.key(best, now)
            worst = None
            # Candidates from the worst key down while they rank below ``best``. Usually ``best``
            # outranks nobody, which the largest key alone shows (the first of the sorted order).
            keyed = [(policy.key(r, now), r) for r in self.running]
            top_key, top = max(keyed, key=_first)
            if best_key < top_key:
                if policy.may_preempt(top, now):
                    worst = top
                else:
                    for cand_key, cand in sorted(keyed, key=_first, reverse=True)[1:]:
                        if not best_key < cand_key:
                            break
                        if policy.may_preempt(cand, now):
                            worst = cand
                            break
            if worst is None:
                break
            self._preempt(worst, now)
            done += 1
        return done

    # --- timing -------------------------------------------------------------------------------
    def _time(self, step: Step, horizon: float, batch: _Batch | None = None) -> None:
        perf = self.perf
        if batch is not None:
            prefill, step.chunked, n_dec, ctx = batch
        else:
            prefill = []
            chunked = step.chunked = []
            n_dec, ctx = _split_batch(step.scheduled.items(), prefill, chunked)
        if prefill or not self._can_fold(step):
            step.duration = perf.step_time(prefill, n_dec, ctx)
            return
        k = self._fold_steps(step, n_dec, ctx, horizon)
        step.k = k
        step.duration = perf.decode_run_time(n_dec, ctx, k)

    def _can_fold(self, step: Step) -> bool:
        """Folding is exact only when nothing could change between the steps: everyone running
        decodes, and no waiting request could be admitted or preempt anyone."""
        if not self.fold_decode or step.preempted or len(step.scheduled) != len(self.running):
            return False
        policy = self.policy
        if self.waiting:
            # Admission was tried this step and stopped: blocks only get scarcer while decoding and
            # the sequence cap holds until someone finishes, unless the policy may preempt for the
            # waiting requests, reorders them over time, or defers decodes to make room for them.
            return not (
                policy.capabilities & {Capability.PREEMPT, Capability.DYNAMIC_KEY, Capability.DEFER_DECODE}
            )
        # Nobody waiting (and nobody arrives before ``horizon``): no admission, no preemption for a
        # waiting request, no deferral (it only yields budget to waiting prefills). A running
        # request's key, which may move with its progress, then orders nothing: the budget covers
        # every decode, and the fold never runs short of blocks, so it never picks a memory victim
        # (``_blocks_allow``). Progress hooks see the ``k`` tokens at once, at the fold's end.
        return True

    def _fold_steps(self, step: Step, n_dec: int, ctx: int, horizon: float) -> int:
        k = min(r.output_tokens - r.generated for r in step.scheduled)
        if horizon != float("inf"):
            k = min(k, max(1, self.perf.decode_steps_within(n_dec, ctx, horizon - step.start)))
        if k <= 1:
            return 1
        pool = self.pool
        bs = pool.block_size
        needs = [-(-(r.num_computed + k) // bs) - r.table.nblocks for r in step.scheduled]
        if sum(needs) > pool.free_blocks:
            k = self._blocks_allow(step, k)
            if k <= 1:
                return 1
            needs = [-(-(r.num_computed + k) // bs) - r.table.nblocks for r in step.scheduled]
        # Every table grows to hold k more tokens; the pool hands the blocks out as that many
        # ``grow`` calls would (they fit: ``_blocks_allow``).
        total = 0
        for req, need in zip(step.scheduled, needs, strict=True):
            if need > 0:
                req.table.nblocks += need
                total += need
        pool.take_fresh(total)
        return k

    def _blocks_allow(self, step: Step, k: int) -> int:
        """Largest ``k' ≤ k`` decode steps whose new blocks fit in the free pool (the first step's
        blocks are already taken)."""
        pool = self.pool
        bs = pool.block_size
        free = pool.free_blocks
        reqs = list(step.scheduled)

        def need(steps: int) -> int:
            return sum(-(-(r.num_computed + steps) // bs) - r.table.nblocks for r in reqs)

        if need(k) <= free:
            return k
        lo, hi = 1, k  # need(lo) == 0 ≤ free; need(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    # --- applying a step ----------------------------------------------------------------------
    def complete(self, step: Step, now: float) -> StepOutcome:
        """Apply ``step`` at its end time ``now``: advance every scheduled request, emit tokens,
        finish and free the completed ones."""
        emitted: list[EngineRequest] = []
        finished: list[EngineRequest] = []
        first: list[EngineRequest] = []
        policy = self.policy
        k = step.k
        hook = self._progress_hook
        emit = emitted.append
        chunked = step.chunked
        if chunked is not None:
            # The hot path: a decoding request has computed its whole prompt (so its prompt blocks
            # are registered) and emits k tokens; only finishing can happen. The few requests with
            # a prefill chunk (``chunked``, in schedule order) take the general path below.
            nxt = chunked[0] if chunked else None
            i = 0
            for req in step.scheduled:
                if req is nxt:
                    i += 1
                    nxt = chunked[i] if i < len(chunked) else None
                    self._apply(req, step.scheduled[req], k, now, emitted, finished, first)
                    continue
                if req.state != RUNNING:
                    continue  # aborted while the step ran
                req.num_computed += k
                generated = req.generated = req.generated + k
                emit(req)
                if hook:
                    policy.on_progress(req, k, now)
                if generated >= req.output_tokens:
                    finished.append(req)
            return self._finish_step(emitted, finished, first, k, now)
        for req, n in step.scheduled.items():
            self._apply(req, n, k, now, emitted, finished, first)
        return self._finish_step(emitted, finished, first, k, now)

    def _apply(
        self,
        req: EngineRequest,
        n: int,
        k: int,
        now: float,
        emitted: list[EngineRequest],
        finished: list[EngineRequest],
        first: list[EngineRequest],
    ) -> None:
        """Advance one scheduled request by its ``n`` tokens (``k`` steps): any kind of entry."""
        if req.state != RUNNING:
            return  # aborted while the step ran
        pool = self.pool
        bs = pool.block_size
        computed = req.num_computed = req.num_computed + n + (k - 1)
        if pool.caching:
            cached = len(req.table.keys)
            shared = req.keys.shared_blocks
            if cached < shared and computed // bs > cached:
                pool.register_full(req.table, min(computed, shared * bs), req.keys)
        generated = req.generated
        if computed < req.prompt_tokens + generated:
            return  # a prefill chunk that did not reach the end of the prompt
        if generated == 0:
            self.prompt_tokens_total += req.prompt_tokens
            req.t_first_token = now
            first.append(req)
        generated = req.generated = generated + k
        emitted.append(req)
        if self._progress_hook:
            self.policy.on_progress(req, k, now)
        if generated >= req.output_tokens:
            finished.append(req)

    def _finish_step(
        self,
        emitted: list[EngineRequest],
        finished: list[EngineRequest],
        first: list[EngineRequest],
        k: int,
        now: float,
    ) -> StepOutcome:
        pool, policy = self.pool, self.policy
        self.generation_tokens_total += k * len(emitted)
        for req in finished:
            req.state = FINISHED
            req.t_finish = now
            self.running.remove(req)
            pool.free(req.table)
            self.finished_total += 1
            policy.on_finish(req, now)
        return StepOutcome(emitted, finished, first)
