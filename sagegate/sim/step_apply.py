"""Applying a completed step to its requests: computed tokens, generated tokens, first tokens.

The engine keeps the batch itself (who runs, who is freed); this module only advances each
scheduled request by what the step computed and sorts the requests into the step's outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from sagegate.sim.engine_request import RUNNING, EngineRequest
from sagegate.sim.kv import BlockPool
from sagegate.sim.step_output import SchedulerOutput, StepOutcome

ProgressHook = Callable[[EngineRequest, int, float], None]
"""A policy's ``on_progress(req, new_tokens, now)``."""


def apply_step(
    step: SchedulerOutput, now: float, pool: BlockPool, on_progress: ProgressHook | None
) -> StepOutcome:
    """Advance every request ``step`` scheduled (and that still runs) at its end time ``now``;
    ``on_progress`` hears of every request that produced tokens."""
    emitted: list[EngineRequest] = []
    finished: list[EngineRequest] = []
    first: list[EngineRequest] = []
    k = step.k
    emit = emitted.append
    scheduled = step.scheduled
    chunked = step.chunked
    # The hot path: a decoding request has computed its whole prompt (so its prompt blocks are
    # registered) and emits k tokens; only finishing can happen. The few requests with a prefill
    # chunk (``chunked``, in schedule order) take the general path, ``_apply_chunk``.
    nxt = chunked[0] if chunked else None
    i = 0
    for req in scheduled:
        if req is nxt:
            i += 1
            nxt = chunked[i] if i < len(chunked) else None
            _apply_chunk(req, scheduled[req], k, now, pool, on_progress, emitted, finished, first)
            continue
        if req.state is not RUNNING:
            continue  # aborted while the step ran
        req.num_computed += k
        generated = req.generated = req.generated + k
        emit(req)
        if on_progress is not None:
            on_progress(req, k, now)
        if generated >= req.output_tokens:
            finished.append(req)
    return StepOutcome(emitted, finished, first)


def _apply_chunk(
    req: EngineRequest,
    n: int,
    k: int,
    now: float,
    pool: BlockPool,
    on_progress: ProgressHook | None,
    emitted: list[EngineRequest],
    finished: list[EngineRequest],
    first: list[EngineRequest],
) -> None:
    """Advance one request with a prefill chunk by its ``n`` tokens (``k`` steps)."""
    if req.state is not RUNNING:
        return  # aborted while the step ran
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
        req.t_first_token = now
        first.append(req)
    generated = req.generated = generated + k
    emitted.append(req)
    if on_progress is not None:
        on_progress(req, k, now)
    if generated >= req.output_tokens:
        finished.append(req)
