"""The simulator's model of vllm-router ``cache_aware`` (``benchmarks.router_model``) routes as the
router's own help text says it does."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.router_model import CHUNK, CacheAwareRouter
from sagegate.core.request import TraceRequest


def engines(*loads: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(num_running=n, num_waiting=0) for n in loads]


def req(text: str) -> TraceRequest:
    return TraceRequest(0.0, 100, 10, prompt=text)


SYSTEM = "s" * (8 * CHUNK)


def test_a_prompt_matching_enough_of_a_tree_follows_it():
    route = CacheAwareRouter()
    fleet = engines(0, 0)
    first = route(req(SYSTEM + "q1" * CHUNK), fleet)  # nothing matches: the smaller tree (a tie: the first)
    assert first == 0
    assert route(req("other" * (4 * CHUNK)), fleet) == 1  # no match: the smaller tree now
    assert route(req(SYSTEM + "q2" * CHUNK), fleet) == first  # 8 of 10 chunks match: > 0.3


def test_a_match_below_the_threshold_goes_to_the_smallest_tree():
    route = CacheAwareRouter(cache_threshold=0.5)
    fleet = engines(0, 0)
    assert route(req(SYSTEM + "a" * (8 * CHUNK)), fleet) == 0
    # half of it matches engine 0's tree, not more than 0.5: engine 1, whose tree is empty
    assert route(req(SYSTEM + "b" * (8 * CHUNK)), fleet) == 1


def test_imbalance_past_both_thresholds_sends_to_the_least_loaded():
    route = CacheAwareRouter()
    assert route(req(SYSTEM), engines(0, 0)) == 0
    assert route(req(SYSTEM), engines(100, 0)) == 1  # 100 − 0 > 64 and 100 > 0 × 1.5
    assert route(req(SYSTEM), engines(100, 40)) == 0  # 60 ≤ 64: the cache decides
    assert route(req(SYSTEM), engines(200, 134)) == 0  # 66 > 64 but 200 ≤ 134 × 1.5
