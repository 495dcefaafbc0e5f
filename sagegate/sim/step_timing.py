"""How long a scheduled step takes, and the decode fold: ``k`` identical decode steps as one.

The step-time model itself is :class:`sim.perf.PerfModel`; this module only hands it a step's batch
(prefill chunks, decode count and context). Where a step changes nothing but the decode position
(every running request decoding, nobody who could be admitted), the engine folds ``k`` such steps
into one, timed in closed form (``PerfModel.decode_run_time``), and the block tables grow for all
``k`` at once. Folding is exact: the simulator's results are bit-identical with and without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sagegate.policies.base import Capability
from sagegate.policies.interfaces import QueueOrder
from sagegate.sim.decode_cohort import DecodeCohort
from sagegate.sim.engine_request import EngineRequest
from sagegate.sim.kv import BlockPool
from sagegate.sim.perf import PerfModel


@dataclass(slots=True)
class Batch:
    """A step's batch as the step-time model reads it."""

    prefill: list[tuple[int, int]]
    """Prefill chunks ``(tokens, already computed)``, in schedule order."""
    chunked: list[EngineRequest]
    """The requests of ``prefill``, in the same order."""
    n_decode: int
    decode_context: int
    """Sum of the decoding requests' computed tokens (the KV they read)."""

    @classmethod
    def of(cls, scheduled: dict[EngineRequest, int]) -> Batch:
        prefill: list[tuple[int, int]] = []
        chunked: list[EngineRequest] = []
        n_decode, context = split_batch(scheduled.items(), prefill, chunked)
        return cls(prefill, chunked, n_decode, context)


def split_batch(
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


_REORDERS = frozenset({Capability.PREEMPT, Capability.DYNAMIC_KEY, Capability.DEFER_DECODE})
"""What makes a fold inexact while requests wait: preempting for them, reordering them over time, or
deferring decodes to make room for them."""


def fold_is_exact(
    policy: QueueOrder, preempted: int, n_scheduled: int, n_running: int, waiting: bool
) -> bool:
    """Folding is exact only when nothing could change between the steps: everyone running decodes
    (the caller checked the batch has no prefill), and no waiting request could be admitted or
    preempt anyone."""
    if preempted or n_scheduled != n_running:
        return False
    if waiting:
        # Admission was tried this step and stopped: blocks only get scarcer while decoding and
        # the sequence cap holds until someone finishes, unless the policy may preempt for the
        # waiting requests, reorders them over time, or defers decodes to make room for them.
        return not (policy.capabilities & _REORDERS)
    # Nobody waiting (and nobody arrives before the horizon): no admission, no preemption for a
    # waiting request, no deferral (it only yields budget to waiting prefills). A running
    # request's key, which may move with its progress, then orders nothing: the budget covers
    # every decode, and the fold never runs short of blocks, so it never picks a memory victim
    # (``blocks_allow``). Progress hooks see the ``k`` tokens at once, at the fold's end.
    return True


def time_step(
    perf: PerfModel,
    pool: BlockPool,
    batch: Batch,
    scheduled: dict[EngineRequest, int],
    window: float,
    foldable: bool,
    cohort: DecodeCohort | None = None,
) -> tuple[float, int]:
    """The step's duration and its number of folded decode steps ``k`` (1 unless ``foldable``).
    A fold takes the blocks its ``k`` steps need from ``pool`` and lasts at most ``window`` seconds
    (or one step); ``cohort``'s members (counted in ``batch``) decode with ``scheduled``."""
    if batch.prefill or not foldable:
        return perf.step_time(batch.prefill, batch.n_decode, batch.decode_context), 1
    n_dec, ctx = batch.n_decode, batch.decode_context
    k = fold_decode_steps(perf, pool, scheduled, n_dec, ctx, window, cohort)
    return perf.decode_run_time(n_dec, ctx, k), k


def fold_decode_steps(
    perf: PerfModel,
    pool: BlockPool,
    scheduled: dict[EngineRequest, int],
    n_dec: int,
    ctx: int,
    window: float,
    cohort: DecodeCohort | None = None,
) -> int:
    """How many decode steps to fold (until the first request finishes, the ``window`` of seconds
    closes, or the blocks run out); grows every table for them (the ``cohort``'s members by its
    count alone: their tables are synced when read)."""
    left = [r.output_tokens - r.generated for r in scheduled]  # a list: faster than a generator
    if cohort is not None:
        left.append(cohort.steps_left())
    k = min(left)
    if window != float("inf"):
        k = min(k, max(1, perf.decode_steps_within(n_dec, ctx, window)))
    if k <= 1:
        return 1
    bs = pool.block_size
    due = 0 if cohort is None else cohort.due()  # the first step's blocks, already taken

    def members_need(steps: int) -> int:
        return 0 if cohort is None else cohort.blocks_for(steps) - due

    def needs(steps: int) -> list[int]:
        return [-(-(r.num_computed + steps) // bs) - r.table.nblocks for r in scheduled]

    def need(steps: int) -> int:
        return sum(needs(steps)) + members_need(steps)

    grows, total = needs(k), members_need(k)
    if sum(grows) + total > pool.free_blocks:
        k = blocks_allow(pool.free_blocks, k, need)
        if k <= 1:
            return 1
        grows, total = needs(k), members_need(k)
    # Every table grows to hold k more tokens; the pool hands the blocks out as that many
    # ``grow`` calls would (they fit: ``blocks_allow``).
    for req, grow in zip(scheduled, grows, strict=True):
        if grow > 0:
            req.table.nblocks += grow
            total += grow
    pool.take_fresh(total)
    return k


def blocks_allow(free: int, k: int, need: Callable[[int], int]) -> int:
    """Largest ``k' ≤ k`` decode steps whose new blocks, ``need(k')``, fit in ``free`` blocks (the
    first step's blocks are already taken, so ``need(1) == 0``)."""
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
