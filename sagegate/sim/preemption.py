"""The engine's preemption by choice: displacing running requests for better waiting ones.

vLLM preempts only when its KV pool runs dry; a ``PREEMPT`` policy may also displace the worst-keyed
running request while a better one waits and cannot get in. For a ``PREEMPT_PAYS`` policy each such
displacement is priced first (:func:`recompute_cost`): the victim's blocks stay cached when it is
preempted (``Engine._preempt`` registers them), so it recomputes only what is evicted before it
resumes; the displacement happens only where the policy's gain exceeds that cost, and the victim is
the one where the margin is widest. Memory victims (the pool ran dry mid-step) stay the policy's
worst-keyed, as in vLLM: picking the cheapest to recompute instead was measured and thrashed, since
the cheapest is a request just admitted, which ranks well and comes straight back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sagegate.policies.base import Capability
from sagegate.policies.interfaces import Displacement
from sagegate.policies.preemption import PreemptionCost, pair_gain_s, pays
from sagegate.sim.engine_request import EngineRequest

if TYPE_CHECKING:
    from sagegate.sim.engine import Engine


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def recompute_cost(engine: Engine, victim: EngineRequest, need_blocks: int) -> PreemptionCost:
    """The cost of preempting ``victim`` so that a request needing ``need_blocks`` fresh blocks gets
    in. Its full blocks go back to the cache, the most recent, tail first (``BlockPool.free``); the
    newcomer takes the free blocks already there first, then evicts the victim's tail: what remains
    of the victim's leading blocks is the prefix it finds again. Its partial last block is lost."""
    pool = engine.pool
    bs = pool.block_size
    known = victim.known_tokens
    full = min(victim.num_computed // bs, victim.table.nblocks) if pool.caching else 0
    evicted = max(0, need_blocks - pool.free_blocks)
    cached = max(0, full - evicted) * bs
    cached = min(cached, known - 1)  # the last known token is always computed again
    recompute = known - cached
    seconds = engine.perf.prefill_time(recompute, engine.config.max_num_batched_tokens)
    return PreemptionCost(known, cached, seconds, len(engine.running))


def decode_step_s(engine: Engine) -> float:
    """One decode step of the running batch: what a token of remaining work costs in time."""
    running = engine.running
    return engine.perf.decode_step_time(len(running), sum(r.num_computed for r in running))


def preempt_for_waiting(engine: Engine, now: float) -> int:
    """Preemptive policies: displace the worst running requests while a better one waits and cannot
    get in (sequence cap or blocks), within the policy's per-step share. Returns how many."""
    policy = engine.policy
    priced = Capability.PREEMPT_PAYS in policy.capabilities
    limit = max(1, int(policy.max_preempt_share * len(engine.running)))
    done = 0
    while done < limit and engine.running:
        best = engine.waiting.peek(now)
        assert best is not None
        need = engine.pool.blocks_for(best.known_tokens)
        full = len(engine.running) >= engine.config.max_num_seqs or need > engine.pool.free_blocks
        if not full:
            break
        best_key = policy.key(best, now)
        keyed = [(policy.key(r, now), r) for r in engine.running]
        worst = (
            _priced_victim(engine, best, best_key, keyed, need, now)
            if priced
            else _worst(policy, best_key, keyed, now)
        )
        if worst is None:
            break
        engine.preempt(worst, now)
        done += 1
    return done


def _worst(
    policy: Displacement, best_key: Any, keyed: list[tuple[Any, EngineRequest]], now: float
) -> EngineRequest | None:
    """The worst-keyed running request ranked below ``best`` that the policy allows, or None.
    Usually ``best`` outranks nobody, which the largest key alone shows."""
    top_key, top = max(keyed, key=_first)
    if not best_key < top_key:
        return None
    if policy.may_preempt(top, now):
        return top
    for cand_key, cand in sorted(keyed, key=_first, reverse=True)[1:]:
        if not best_key < cand_key:
            break
        if policy.may_preempt(cand, now):
            return cand
    return None


def _priced_victim(
    engine: Engine,
    best: EngineRequest,
    best_key: Any,
    keyed: list[tuple[Any, EngineRequest]],
    need: int,
    now: float,
) -> EngineRequest | None:
    """Of the running requests ranked below ``best`` that the policy allows, the one whose gain
    exceeds its cost by the most; None when no displacement pays."""
    policy = engine.policy
    cands = [c for k, c in keyed if best_key < k and policy.may_preempt(c, now)]
    if not cands:
        return None
    step_s = decode_step_s(engine)
    left = {r.rid: policy.expected_remaining(r) for r in engine.running}
    # The first departure other than the victim's: the smallest expected remainder, or the second
    # smallest for the request that holds the smallest.
    order = sorted(left.values())
    first, second = order[0], order[1] if len(order) > 1 else float("inf")
    best_left = policy.expected_remaining(best)
    chosen: EngineRequest | None = None
    margin = 0.0
    for cand in cands:
        v = left[cand.rid]
        room = second if v == first else first
        gain = pair_gain_s(v, best_left, room, step_s)
        if gain <= margin:
            continue
        cost = recompute_cost(engine, cand, need)
        if pays(gain, cost) and gain - cost.delay_s > margin:
            chosen, margin = cand, gain - cost.delay_s
    return chosen
