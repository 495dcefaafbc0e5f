"""A prompt prefix held by several requests in flight on one backend is charged once (issue 36, item 4)."""

from __future__ import annotations

from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.placement import choose_placement
from sagegate.policies.resident import PromptBlocks

CFG = AdmissionConfig()
BLOCK = 16
_private = count(1)


def keys(group: int, blocks: int, tail: int = 0) -> list[tuple[int, int]]:
    """``blocks`` keys shared by ``group``, then ``tail`` private ones."""
    own = -next(_private)
    return [(group, j) for j in range(blocks)] + [(own, j) for j in range(tail)]


def charge(ks: list[tuple[int, int]], out: int, extra: int = 5) -> Charge:
    """A request of ``len(ks)`` whole blocks plus ``extra`` tokens, predicted to write ``out``."""
    prompt = len(ks) * BLOCK + extra
    return Charge(prompt, LengthDistribution((out,), (1.0,)), CFG, PromptBlocks(ks, BLOCK))


def test_a_prefix_in_flight_is_charged_once_and_stays_charged_until_its_last_user_leaves() -> None:
    load = BackendLoad(100_000)
    first = charge(keys(7, 60), 10)
    choose_placement(first, [load], CFG, 965, None, None)
    load.charge(first)
    assert load.charged_tokens == 60 * BLOCK + 5 + 10
    waiting = charge(keys(7, 60), 10)
    assert choose_placement(waiting, [load], CFG, 965, None, None).charge is None  # not computed yet
    load.progress(first, 1)  # it started: its prompt's blocks are computed

    second = charge(keys(7, 60) + keys(8, 4), 10)  # the same 60 blocks, then its own question
    placed = choose_placement(second, [load], CFG, 1029, None, None)
    assert placed.backend == 0 and placed.charge is not None
    assert placed.charge.value == second.value - 60 * BLOCK  # charged without the 60 shared blocks
    load.charge(placed.charge)
    distinct = (60 + 4) * BLOCK
    assert load.charged_tokens == distinct + 2 * 5 + 2 * 10

    load.release(first)  # the payer leaves first: its 60 blocks stay, held by the second
    assert load.resident.pinned_tokens == 60 * BLOCK
    assert load.charged_tokens == distinct + 5 + 10
    load.release(placed.charge)
    assert load.charged_tokens == 0 and load.resident.pinned_tokens == 0 and not len(load.resident)


def test_a_warm_backend_admits_a_request_whose_whole_charge_would_not_fit() -> None:
    cap = 2_000
    warm, cold = BackendLoad(cap), BackendLoad(cap)
    holder = charge(keys(1, 100), 50)  # 1,655 tokens: warm is nearly full
    warm.charge(holder)
    warm.progress(holder, 1)
    cold.charge(charge(keys(2, 100), 50))
    sibling = charge(keys(1, 100), 50)
    assert not warm.admits(sibling, CFG) and not cold.admits(sibling, CFG)
    placed = choose_placement(sibling, [warm, cold], CFG, 1605, None, None)
    assert placed.backend == 0  # it only needs its own 5 tokens and 50 out there


def test_without_blocks_nothing_changes() -> None:
    load = BackendLoad(10_000)
    plain = Charge(500, LengthDistribution((10,), (1.0,)), CFG)
    assert plain.sharing(3) is plain
    load.charge(plain)
    again = Charge(500, LengthDistribution((10,), (1.0,)), CFG)
    assert choose_placement(again, [load], CFG, 500, None, None).charge is None


ops = st.lists(
    st.tuples(
        st.sampled_from(("arrive", "start", "leave")),
        st.integers(0, 2),
        st.integers(0, 6),
        st.integers(0, 3),
        st.integers(2, 30),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_charged_tokens_equal_the_distinct_blocks_held_plus_what_is_private(script: list) -> None:
    """Whatever the order of arrivals and departures, a backend is charged each distinct block its
    requests hold once, plus each request's partial block and output."""
    load = BackendLoad(10**9)
    inflight: list[tuple[Charge, list[tuple[int, int]], int, float, int]] = []
    for op, group, shared, tail, out in script:
        if op == "arrive" or not inflight:
            ks = keys(group, shared, tail)
            whole = charge(ks, out)
            held = {k for c, kk, *_ in inflight for k in kk}
            placed = choose_placement(whole, [load], CFG, whole.held, None, None)
            c = placed.charge or whole
            assert c.blocks is not None
            copies = sum(1 for k in ks[c.blocks.shared :] if k in held)  # computing a copy of its own
            load.charge(c)
            inflight.append((c, ks, out, whole.value, copies))
        elif op == "start":
            load.progress(inflight[out % len(inflight)][0], 1)
        else:
            load.release(inflight.pop(out % len(inflight))[0])
        held = {k for _, ks, *_ in inflight for k in ks}
        private = sum(5 + out for _, _, out, *_ in inflight)
        assert len(held) * BLOCK + private <= load.charged_tokens + 1e-6  # every held block charged
        # never more than the whole charges, but for blocks computed twice (a request that missed
        # a prefix another had not computed yet holds a copy of its own, and both are charged)
        twice = sum(copies for *_, copies in inflight) * BLOCK
        assert load.charged_tokens <= sum(w for *_, w, _ in inflight) + twice + 1e-6
        assert (load.charged_tokens == 0) == (not inflight)


def test_the_cache_aware_rank_serves_a_request_whose_prefix_is_resident_first() -> None:
    from sagegate.policies.base import SchedRequest
    from sagegate.policies.registry import parse_policy

    dist = LengthDistribution((200, 800), (0.5, 0.5))
    for spec, resident_first in (("sagesched", True), ("sagesched:shared_prefix=false", False)):
        policy = parse_policy(spec)
        cold = SchedRequest("cold", 0.0, 7000, prediction=dist)
        warm = SchedRequest("warm", 1.0, 7000, prediction=dist)  # arrived later
        warm.shared_tokens = 6000  # a sibling in flight holds its system prompt
        for r in (cold, warm):
            policy.on_arrival(r, r.arrival_s)
        assert (policy.key(warm, 2.0) < policy.key(cold, 2.0)) is resident_first, spec


def test_resident_prefix_reads_the_most_any_backend_holds_computed() -> None:
    from sagegate.policies.admission import resident_prefix

    a, b = BackendLoad(100_000), BackendLoad(100_000)
    held = charge(keys(3, 40), 10)
    b.charge(held)
    probe = charge(keys(3, 40) + keys(4, 2), 10)
    assert resident_prefix(probe, [a, b]) == 0  # in flight but not started: nothing computed yet
    b.progress(held, 1)
    assert resident_prefix(probe, [a, b]) == 40 * BLOCK
    assert resident_prefix(Charge(700, None, CFG), [a, b]) == 0  # blocks unknown
