"""Cache-aware placement (issue 36): the prefix index, the placement rule, and the index's predictions
against the simulated engine's own prefix cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.prefix import text_block_keys
from sagegate.core.request import TraceRequest
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, choose_backend, eligible
from sagegate.policies.placement import CACHE_AWARE, CacheView, PlacementKind, choose_placement
from sagegate.policies.prefix_index import PrefixIndex
from sagegate.policies.registry import parse_policy
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, Simulation
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

# --- the index -------------------------------------------------------------------------------------


def test_the_index_matches_leading_blocks_only() -> None:
    idx = PrefixIndex(100)
    idx.touch([1, 2, 3])
    assert idx.match([1, 2, 3, 4]) == 3
    assert idx.match([1, 9, 3]) == 1  # counting stops at the first block not held
    assert idx.match([]) == 0


def test_the_index_evicts_the_least_recently_used_past_its_capacity() -> None:
    idx = PrefixIndex(4)
    idx.touch([1, 2])
    idx.touch([3, 4])
    idx.touch([1, 2])  # used again: now the newest
    idx.touch([5])
    assert len(idx) == 4  # 4 went: the oldest request's tail
    assert idx.match([3, 4]) == 1 and idx.match([1, 2]) == 2 and idx.match([5]) == 1
    idx.resize(2)  # 3 then 2 go
    assert len(idx) == 2 and idx.match([1, 2]) == 1 and idx.match([3]) == 0
    idx.clear()
    assert len(idx) == 0 and idx.match([5]) == 0


def test_a_prefix_partly_evicted_still_matches_its_head_as_the_engines_cache_does() -> None:
    """vLLM frees a request's blocks tail first, so its cache gives up a prompt's tail before its
    prefix (``sim.kv`` does the same): the index must too, or the first block evicted takes the
    whole match with it while the engine still holds all but the tail."""
    idx = PrefixIndex(10)
    idx.touch([1, 2, 3, 4, 5, 6])  # a group's prefix
    idx.touch([7, 8, 9, 10, 11, 12])  # another's: two of the first are evicted
    assert len(idx) == 10
    assert idx.match([1, 2, 3, 4, 5, 6]) == 4  # its head survives: its tail (5, 6) went first
    assert idx.match([7, 8, 9, 10, 11, 12]) == 6


def test_a_claim_counts_until_settled_and_leaves_nothing_unless_computed() -> None:
    idx = PrefixIndex(100)
    idx.touch([1, 2])
    refused = idx.claim([1, 2, 3, 4])  # sent: 3 and 4 are claimed, 1 and 2 are held already
    assert refused == (3, 4) and idx.match([1, 2, 3, 4]) == 4 and len(idx) == 2
    computed = idx.claim([1, 2, 3, 5])  # a second request sharing the new block 3
    idx.settle(refused)  # the first was refused: its claim goes, the second's stays
    assert idx.match([1, 2, 3, 4]) == 3 and idx.match([1, 2, 3, 5]) == 4
    idx.settle(computed)
    idx.touch([1, 2, 3, 5])  # the second was computed: its blocks are held now
    assert idx.match([1, 2, 3, 5]) == 4 and idx.match([1, 2, 3, 4]) == 3 and len(idx) == 4
    idx.settle(idx.claim([7]))
    assert idx.match([7]) == 0 and len(idx) == 4


def test_chained_keys_share_exactly_the_shared_prefix() -> None:
    a = text_block_keys("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = text_block_keys("x" * 64 + "y" * 64 + "w" * 64, 64)
    c = text_block_keys("q" * 64 + "y" * 64, 64)
    assert len(a) == 2 and a == b[:2] and b[2] not in a
    assert c[1] != a[1]  # the same block after a different prefix is another block
    assert text_block_keys("é" * 64, 32) == text_block_keys("é" * 64, 32)  # non-ASCII: per span


# --- the placement rule -----------------------------------------------------------------------------
CFG = AdmissionConfig()


def _load(capacity: int = 10_000, waiting_tokens: int = 0, charged: int = 0) -> BackendLoad:
    load = BackendLoad(capacity, waiting=1 if waiting_tokens else 0, waiting_tokens=waiting_tokens)
    if charged:
        load.charge(Charge(charged, None, CFG))
    return load


def test_without_hits_placement_is_the_most_room_rule() -> None:
    loads = [_load(charged=3000), _load(charged=1000), _load(charged=2000)]
    charge = Charge(500, None, CFG)
    p = choose_placement(charge, loads, CFG, 500, None, CacheView([0, 0, 0], [0, 0, 0]))
    assert p.backend == choose_backend(charge, loads, CFG, 500) == 1 and p.kind is PlacementKind.NO_HIT
    assert choose_placement(charge, loads, CFG, 500, None, None).backend == 1


def test_with_nothing_cached_a_tie_in_room_goes_to_the_emptier_cache() -> None:
    idle = [_load(), _load(), _load()]
    charge = Charge(500, None, CFG)
    view = CacheView([0, 0, 0], [9000, 4000, 6000])
    assert choose_placement(charge, idle, CFG, 500, None, view).backend == 1
    assert choose_placement(charge, idle, CFG, 500, None, None).backend == 0  # room alone: the first


def test_a_request_sticks_to_its_cache_until_the_queue_there_costs_more() -> None:
    charge = Charge(4000, None, CFG)
    warm_idle = [_load(charged=3000), _load()]
    view = CacheView([3200, 0], [3200, 0])
    p = choose_placement(charge, warm_idle, CFG, 4000, None, view)
    assert (p.backend, p.cached_tokens, p.kind) == (0, 3200, PlacementKind.STICKY)
    warm_busy = [_load(charged=3000, waiting_tokens=3500), _load()]
    p = choose_placement(charge, warm_busy, CFG, 4000, None, view)
    assert (p.backend, p.kind) == (1, PlacementKind.BROKE_AWAY)  # 3,500 queued > 3,200 saved
    masked = choose_placement(charge, warm_idle, CFG, 4000, [False, True], view)
    assert masked.backend == 1  # never where the request may not go


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 8000), st.integers(0, 3000), st.booleans(), st.integers(0, 3000)),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 3000),
)
def test_placement_only_ever_chooses_a_backend_the_rule_admits(
    backends: list[tuple[int, int, bool, int]], prompt: int
) -> None:
    loads = []
    cached = []
    for charged, waiting_tokens, healthy, hit in backends:
        load = _load(charged=charged, waiting_tokens=waiting_tokens)
        load.healthy = healthy
        loads.append(load)
        cached.append(min(hit, prompt - 1) if prompt > 1 else 0)
    charge = Charge(prompt, None, CFG)
    p = choose_placement(charge, loads, CFG, prompt, None, CacheView(cached, [0] * len(cached)))
    default = choose_backend(charge, loads, CFG, prompt)
    if p.backend is None:
        assert default is None  # a backend the most-room rule admits is never refused
        return
    chosen = loads[p.backend]
    assert chosen.admits(charge, CFG) and p.cached_tokens == cached[p.backend]
    # its backlog bound is met in prefill: the whole prompt, or (a warm backend) the uncached part
    assert eligible(chosen, p.backend, CFG, prompt, None) or (
        cached[p.backend] > 0 and eligible(chosen, p.backend, CFG, prompt, None, cached[p.backend])
    )
    if default is None:
        assert cached[p.backend] > 0  # only what it holds can take it past the whole-prompt rule
        return

    def score(i: int) -> int:
        return cached[i] - loads[i].waiting_tokens

    assert score(p.backend) >= score(default)  # never worse than the most-room choice
    if not any(cached):
        assert p.backend == default


# --- the index against the simulated engine's own cache --------------------------------------------
def _shared_prompt_workload(n: int, gap_s: float, groups: int = 3) -> list[TraceRequest]:
    """``groups`` system prompts of ~1,000 tokens, each request one of them plus its own question."""
    heads = ["".join(chr(65 + (g * 5 + i) % 26) for i in range(4000)) for g in range(groups)]
    out = []
    for i in range(n):
        text = heads[i % groups] + f" question {i}: " + "w" * (400 + 37 * (i % 7))
        out.append(TraceRequest(i * gap_s, len(text) // 4, 20, rid=i, prompt=text))
    return out


def _run(workload: list[TraceRequest], placement: str, blocks: int | None = None) -> Simulation:
    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    engine = EngineConfig(num_gpu_blocks_override=blocks) if blocks else EngineConfig()
    setup = SimSetup(
        perf, engine, engines=2, level="gateway", policy=parse_policy("fcfs"), placement=placement
    )
    sim = Simulation(workload, setup)
    assert sim.gw is not None
    sim.gw.dispatch_loop.log = []
    sim.run()
    return sim


def test_predicted_hits_are_the_engines_own_when_nothing_is_evicted() -> None:
    sim = _run(_shared_prompt_workload(30, gap_s=2.0), CACHE_AWARE)
    assert sim.gw is not None and sim.gw.dispatch_loop.log is not None
    predicted = {d.request.rid: d.placement.cached_tokens for d in sim.gw.dispatch_loop.log if d.placement}
    actual = {r.rid: r.cached_tokens for r in sim.records.values()}
    assert predicted == actual
    assert sum(1 for v in actual.values() if v > 0) == 27  # every request after each group's first


def test_cache_aware_placement_keeps_groups_apart_where_one_cache_cannot_hold_them() -> None:
    """Four system prompts, two engines each holding ~2.5 of them, requests one at a time: by room
    alone every request ties and lands on the first engine, whose LRU cycles through four groups and
    never hits; cache-aware, the groups spread two an engine and miss once each."""
    work = _shared_prompt_workload(90, gap_s=0.2, groups=4)
    misses = {}
    for placement in (CACHE_AWARE, "least_loaded"):
        sim = _run(work, placement, blocks=200)
        misses[placement] = sum(1 for r in sim.records.values() if r.cached_tokens == 0)
    assert misses == {CACHE_AWARE: 4, "least_loaded": 90}


def test_under_eviction_the_index_still_predicts_most_hits_right() -> None:
    """A pool of ~2.5 groups' worth of blocks per engine: the engine evicts, and the index (LRU at the
    same capacity, touched at dispatch and at the end, tail first as the engine frees) keeps each
    group where its prefix is: most of the prompt tokens are hits (an index that evicted a prefix's
    head first forgot groups the engines still held, and 28% were), and the prediction is within
    three blocks (it counts prompt blocks only; the engine holds the outputs' too)."""
    work = _shared_prompt_workload(90, gap_s=0.4, groups=6)
    sim = _run(work, CACHE_AWARE, blocks=200)
    assert sim.gw is not None and sim.gw.dispatch_loop.log is not None
    predicted = {d.request.rid: d.placement.cached_tokens for d in sim.gw.dispatch_loop.log if d.placement}
    actual = {r.rid: r.cached_tokens for r in sim.records.values()}
    close = sum(abs(predicted[rid] - actual[rid]) <= 3 * 16 for rid in actual)
    assert sum(actual.values()) >= 0.6 * sum(r.prompt_tokens for r in work)
    assert close >= 0.9 * len(actual)
