"""The lane index picks exactly what a scan of every key picks, for every dynamic policy.

Two copies of each dynamic policy of the registry are driven through the same random sequence of
arrivals, dispatches, removals, clock moves and life-cycle hooks: one behind the indexed
``PolicyQueue``, one behind the plain O(n) scan (``scan=True``). Every peek and pop must return the same
request with the same key. Thresholds are lowered so that flips (starvation, urgency, the slack floor)
happen within a sequence, and values are coarse so that keys tie and rounding collapses nearby ranks.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.base import Capability, Policy, SchedRequest
from sagegate.policies.queue import PolicyQueue
from sagegate.policies.registry import parse_policy, registry

DYNAMIC = sorted(name for name, info in registry().items() if Capability.DYNAMIC_KEY in info.cls.capabilities)
# Lower thresholds so that flips happen within a short sequence.
SPECS = {
    "fastserve": "fastserve:starvation_s=2.0,base_quantum_ms=5",
    "ltr": "ltr:starvation_rounds=3",
    "ssjf": "ssjf:starvation_s=2.0",
    "scorpio-guard": "scorpio-guard:slack_floor_s=0.2",
}
CASES = [SPECS.get(n, n) for n in DYNAMIC] + [  # a parameter can make one dynamic
    "sagesched:max_wait_s=2.0",
    "sagesched:fair_tenants=true",
    "sagesched:fair_tenants=true,max_wait_s=2.0",
]
PREDS: list[LengthDistribution | None] = [
    None,
    LengthDistribution.point(10),
    LengthDistribution.point(100),
    LengthDistribution.point(100),
    LengthDistribution.point(300),
    LengthDistribution.from_samples([5, 20, 20, 80, 400], max_points=4),
]
DEADLINES = [None, 0.05, 0.3, 0.3 + 1e-12, 1.0, 1.0 + 2e-12, 3.0, 30.0]  # after arrival
STEPS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 10.0, 1e6]  # 1e6: rounding collapses ranks

Op = tuple[Any, ...]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.integers(0, 2),  # tenant
            st.sampled_from([0, 1, 3]),  # priority
            st.sampled_from([10, 100, 1000]),  # prompt tokens
            st.integers(0, len(PREDS) - 1),
            st.integers(0, len(DEADLINES) - 1),
        ),
        st.tuples(st.just("pop")),
        st.tuples(st.just("peek")),
        st.tuples(st.just("peek_before"), st.sampled_from(STEPS[1:6])),
        st.tuples(st.just("remove"), st.integers(0, 1 << 16)),
        st.tuples(st.just("advance"), st.sampled_from(STEPS)),
        st.tuples(st.just("progress"), st.integers(0, 1 << 16), st.sampled_from([1, 5, 50])),
        st.tuples(st.just("finish"), st.integers(0, 1 << 16)),
        st.tuples(st.just("preempt"), st.integers(0, 1 << 16)),
        st.tuples(st.just("pause"), st.integers(0, 1 << 16)),
    ),
    max_size=150,
)


class World:
    """One policy, its queue and its own copies of the requests (``pstate`` belongs to one policy)."""

    def __init__(self, spec: str, scan: bool) -> None:
        self.policy = parse_policy(spec)
        self.queue: PolicyQueue[SchedRequest] = PolicyQueue(self.policy, scan=scan)
        self.reqs: dict[int, SchedRequest] = {}


def drive(spec: str, program: list[Op]) -> int:
    """Run ``program`` on an indexed and a scanning world; assert identical picks. Returns how many."""
    fast, slow = World(spec, scan=False), World(spec, scan=True)
    if Capability.LANE_KEY in fast.policy.capabilities:
        assert fast.queue._index is not None  # the index is what is under test
    worlds = (fast, slow)
    queued: list[int] = []
    running: list[int] = []
    now, picks = 0.0, 0

    def same_pick(t: float, pop: bool) -> int | None:
        nonlocal picks
        got = [w.queue.pop(t) if pop else w.queue.peek(t) for w in worlds]
        if got[1] is None:
            assert got[0] is None
            return None
        assert got[0] is not None, "index lost a request"
        assert (got[0].rid, got[0].key_cache) == (got[1].rid, got[1].key_cache)
        picks += 1
        return got[0].rid

    for op in program:
        kind = op[0]
        if kind == "arrive":
            _, tenant, priority, prompt, pred, deadline = op
            rid = len(fast.reqs)
            d = DEADLINES[deadline]
            for w in worlds:
                r = SchedRequest(
                    rid,
                    now,
                    prompt,
                    tenant="abc"[tenant],
                    priority=priority,
                    deadline_s=None if d is None else now + d,
                    prediction=PREDS[pred],
                )
                w.reqs[rid] = r
                w.policy.on_arrival(r, now)
                w.queue.push(r, now)
            queued.append(rid)
        elif kind in ("pop", "peek"):
            rid = same_pick(now, kind == "pop")
            if kind == "pop" and rid is not None:
                queued.remove(rid)
                running.append(rid)
                for w in worlds:
                    w.policy.on_dispatch(w.reqs[rid], now)
        elif kind == "peek_before":
            same_pick(max(0.0, now - op[1]), False)
        elif kind == "advance":
            now += op[1]
        elif kind == "remove" and queued:
            rid = queued.pop(op[1] % len(queued))
            for w in worlds:
                assert w.queue.remove(w.reqs[rid])
                w.policy.on_finish(w.reqs[rid], now)
        elif kind == "progress" and running:
            rid = running[op[1] % len(running)]
            for w in worlds:
                r = w.reqs[rid]
                r.generated += op[2]
                w.policy.on_progress(r, op[2], now)
        elif kind == "finish" and running:
            rid = running.pop(op[1] % len(running))
            for w in worlds:
                w.policy.on_finish(w.reqs[rid], now)
        elif kind == "preempt" and running:  # back to waiting, as the engine does (no on_arrival)
            rid = running.pop(op[1] % len(running))
            for w in worlds:
                w.policy.on_preempt(w.reqs[rid], now)
                w.queue.push(w.reqs[rid], now)
            queued.append(rid)
        elif kind == "pause" and running:  # the gateway's order: queued again, then the policy told
            rid = running.pop(op[1] % len(running))
            for w in worlds:
                w.queue.push(w.reqs[rid], now)
                w.policy.on_preempt(w.reqs[rid], now)
                w.queue.place_again(w.reqs[rid], now)
            queued.append(rid)
    while queued:  # drain: every remaining request in the same order
        rid = same_pick(now, True)
        assert rid is not None
        queued.remove(rid)
        for w in worlds:
            w.policy.on_dispatch(w.reqs[rid], now)
        now += 0.05
    assert len(fast.queue) == len(slow.queue) == 0
    return picks


# Ranks that tie after rounding, which random sequences rarely build:
# WFS with only preempted requests of a tenant queued (class factor 0: every score is 0, so first
# come first served across ranks of different weight; the heaviest arrived last) ...
TIED_RANKS: list[Op] = [
    *[("arrive", 0, 1, 100, p, 0) for p in (5, 4, 2, 3, 1)],
    *[("pop",)] * 5,
    *[("preempt", 0)] * 5,
    *[("pop",)] * 5,
]
# ... and kv-constrained with latest starts one rounding step apart: at a clock of 1e6 both laxities
# round to the same value, so the earlier request (the later latest start) goes first.
COLLAPSED_LAXITY: list[Op] = [
    ("arrive", 0, 1, 100, 2, 3),
    ("arrive", 0, 1, 100, 2, 2),
    ("advance", 1e6),
    ("pop",),
    ("pop",),
]

# A peek at an earlier instant than the last one undoes flips (ssjf: both requests starve at 2.1, the
# first one first; at 1.85 neither does, and the shorter, second one goes first).
CLOCK_BACK: list[Op] = [
    ("arrive", 0, 1, 100, 4, 0),
    ("advance", 0.1),
    ("arrive", 0, 1, 100, 2, 0),
    ("advance", 2.0),
    ("peek",),
    ("peek_before", 0.25),
]


@pytest.mark.parametrize("spec", CASES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
@example(program=TIED_RANKS)
@example(program=COLLAPSED_LAXITY)
@example(program=CLOCK_BACK)
def test_indexed_queue_picks_what_the_scan_picks(spec: str, program: list[Op]) -> None:
    drive(spec, program)


def _long_program(seed: int, n: int) -> list[Op]:
    """Many requests queued at once: deep rank heaps, stale ranks, many flips."""
    rng = random.Random(seed)
    program: list[Op] = []
    for _ in range(n):
        x = rng.random()
        if x < 0.45:
            program.append(
                ("arrive", rng.randrange(3), rng.choice([0, 1, 3]), rng.choice([10, 100, 1000]),
                 rng.randrange(len(PREDS)), rng.randrange(len(DEADLINES)))
            )  # fmt: skip
        elif x < 0.6:
            program.append(("pop",))
        elif x < 0.65:
            program.append(("remove", rng.randrange(1 << 16)))
        elif x < 0.7:
            program.append(("peek_before", rng.choice(STEPS[1:6])))
        elif x < 0.8:
            program.append(("advance", rng.choice(STEPS[:-1])))
        elif x < 0.88:
            program.append(("progress", rng.randrange(1 << 16), rng.choice([1, 5, 50])))
        elif x < 0.94:
            program.append(("finish", rng.randrange(1 << 16)))
        else:
            program.append(("preempt", rng.randrange(1 << 16)))
    return program


@pytest.mark.parametrize("spec", CASES)
def test_indexed_queue_agrees_on_a_long_run(spec: str) -> None:
    assert drive(spec, _long_program(11, 4000)) > 500


def filled(spec: str, n: int, gap: float, seed: int) -> tuple[Policy, PolicyQueue[SchedRequest]]:
    """``spec``'s policy and a queue of ``n`` varied requests arriving ``gap`` apart."""
    policy = parse_policy(spec)
    queue: PolicyQueue[SchedRequest] = PolicyQueue(policy)
    rng = random.Random(seed)
    for i in range(n):
        r = SchedRequest(
            i,
            i * gap,
            rng.randint(10, 4000),
            tenant=rng.choice("abc"),
            priority=rng.choice([1, 2]),
            deadline_s=rng.uniform(1, 100),
            prediction=LengthDistribution.point(rng.randint(5, 500)),
        )
        policy.on_arrival(r, i * gap)
        queue.push(r, i * gap)
    return policy, queue


LANE_CASES = [spec for spec in CASES if Capability.LANE_KEY in parse_policy(spec).capabilities]


@pytest.mark.parametrize("spec", LANE_CASES)
def test_a_pick_reads_few_keys_however_long_the_queue(spec: str) -> None:
    """Sublinear: a pick evaluates a handful of primaries (lane heads), not the keys of all 2,000."""
    policy, queue = filled(spec, 2000, 0.001, seed=5)
    calls = 0
    key, primary = policy.key, policy.primary

    def counting_key(req: SchedRequest, now: float) -> Any:
        nonlocal calls
        calls += 1
        return key(req, now)

    def counting_primary(lane: Any, rank: Any, now: float) -> tuple[Any, ...]:
        nonlocal calls
        calls += 1
        return primary(lane, rank, now)

    policy.key = counting_key  # type: ignore[method-assign]
    policy.primary = counting_primary  # type: ignore[method-assign]
    for step in range(50):
        now = 2.0 + step * 0.01
        req = queue.pop(now)
        assert req is not None
        policy.on_dispatch(req, now)
    assert calls <= 50 * 30, calls


@pytest.mark.parametrize("spec", ["fcfs", "sagesched", "edf", *CASES])
def test_ordered_snapshot_lists_what_successive_pops_return(spec: str) -> None:
    _, queue = filled(spec, 300, 0.01, seed=3)
    now = 4.0  # some have aged or grown urgent by now
    first = [r.rid for r in queue.ordered(now, 25)]
    everything = [r.rid for r in queue.ordered(now)]
    popped = [queue.pop(now).rid for _ in range(25)]  # type: ignore[union-attr]
    assert first == popped == everything[:25] and len(everything) == 300
