"""The Gittins rank and its boundary-quantised cache (policies/gittins.py, policies/cost.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.cost import cost_support, length_cost, length_support, service_cost
from sagegate.policies.gittins import GittinsTable, GittinsTracker, boundaries_tokens, gittins_rank


def brute_rank(costs: list[float], probs: list[float], a: float) -> float:
    """The definition, evaluated literally: min over j of E[min(C,c_j) − a | C>a] / P(C ≤ c_j | C>a)."""
    surv = [(c, q) for c, q in zip(costs, probs, strict=True) if c > a]
    mass = math.fsum(q for _, q in surv)
    vals = []
    for cj, _ in surv:
        num = math.fsum(q * (min(c, cj) - a) for c, q in surv) / mass
        den = math.fsum(q for c, q in surv if c <= cj) / mass
        vals.append(num / den)
    return min(vals)


# --- cost model ---------------------------------------------------------------------------------
def test_service_cost_is_kv_memory_time() -> None:
    # I = 100, O = 10: 100·10 + 10²/2 = 1000 + 50
    assert service_cost(100, 10) == 1050.0
    # No prompt: only the growing KV of the output, 4²/2 = 8
    assert service_cost(0, 4) == 8.0
    assert length_cost(37) == 37.0


def test_cost_support_maps_each_point_with_the_same_arithmetic() -> None:
    d = LengthDistribution((3, 40, 900), (0.2, 0.5, 0.3))
    assert cost_support(d, 123) == tuple(service_cost(123, o) for o in d.support)
    assert length_support(d) == (3.0, 40.0, 900.0)


# --- the rank -----------------------------------------------------------------------------------
def test_two_point_by_hand() -> None:
    costs, probs = [10.0, 100.0], [0.5, 0.5]
    # a = 0.  j=1: E[min(C,10)] = 10, P(C≤10) = 0.5 → 20.   j=2: E[C] = 5 + 50 = 55, P = 1 → 55.
    assert gittins_rank(costs, probs, 0.0) == pytest.approx(20.0)
    # a = 5.  j=1: E[min(C,10) − 5] = 5, P = 0.5 → 10.      j=2: E[C − 5] = 2.5 + 47.5 = 50 → 50.
    assert gittins_rank(costs, probs, 5.0) == pytest.approx(10.0)
    # a = 10: only C = 100 survives → remaining 90 with certainty.
    assert gittins_rank(costs, probs, 10.0) == pytest.approx(90.0)
    # Skewed towards the long point, the full horizon wins:
    # probs (0.1, 0.9): j=1: 10/0.1 = 100;  j=2: E[C] = 1 + 90 = 91 → 91.
    assert gittins_rank(costs, [0.1, 0.9], 0.0) == pytest.approx(91.0)
    # probs (0.9, 0.1): j=1: 10/0.9 = 11.11…; j=2: E[C] = 9 + 10 = 19 → 11.11…
    assert gittins_rank(costs, [0.9, 0.1], 0.0) == pytest.approx(10.0 / 0.9)


@given(
    c=st.floats(1.0, 1e12, allow_nan=False),
    frac=st.floats(0.0, 1.0, exclude_max=True),
)
def test_point_distribution_is_srpt(c: float, frac: float) -> None:
    a = c * frac
    assume(a < c)
    assert gittins_rank([c], [1.0], a) == pytest.approx(c - a, rel=1e-12)


def test_point_prediction_through_the_table_is_remaining_service_cost() -> None:
    d = LengthDistribution.point(300)
    t = GittinsTable(d, 1000, base=None)
    assert t.rank_at(0) == service_cost(1000, 300)
    assert t.exact_rank(120) == pytest.approx(service_cost(1000, 300) - service_cost(1000, 120))


def test_past_the_support_extrapolates_remaining_equal_to_attained() -> None:
    costs, probs = [10.0, 100.0], [0.5, 0.5]
    assert gittins_rank(costs, probs, 100.0) == 100.0  # exactly at the last point: max(a, c_n)
    assert gittins_rank(costs, probs, 250.0) == 250.0
    # Grows with age, stays finite and positive.
    assert gittins_rank(costs, probs, 1e9) > gittins_rank(costs, probs, 1e6) > 0


def test_zero_mass_above_attained_uses_the_fallback() -> None:
    assert gittins_rank([10.0, 100.0], [1.0, 0.0], 20.0) == 100.0
    # A zero-probability first survivor is skipped, not divided by.
    assert gittins_rank([10.0, 100.0], [0.0, 1.0], 0.0) == pytest.approx(100.0)


def sorted_costs(draw: st.DrawFn) -> list[float]:
    n = draw(st.integers(1, 40))
    cs = draw(st.lists(st.floats(1.0, 1e10, allow_nan=False), min_size=n, max_size=n, unique=True))
    return sorted(cs)


@st.composite
def cost_dist_and_attained(draw: st.DrawFn) -> tuple[list[float], list[float], float]:
    costs = sorted_costs(draw)
    probs = draw(st.lists(st.floats(1e-6, 1.0), min_size=len(costs), max_size=len(costs)))
    if draw(st.booleans()):
        total = math.fsum(probs)
        probs = [p / total for p in probs]
    a = draw(
        st.one_of(
            st.just(0.0),
            st.sampled_from(costs),  # exactly at a support point (that point no longer survives)
            st.floats(0.0, costs[-1] * 1.2, allow_nan=False),
        )
    )
    return costs, probs, a


@settings(max_examples=400, deadline=None)
@given(cost_dist_and_attained())
def test_rank_matches_the_definition(case: tuple[list[float], list[float], float]) -> None:
    costs, probs, a = case
    got = gittins_rank(costs, probs, a)
    if a >= costs[-1]:
        assert got == max(a, costs[-1])
        return
    want = brute_rank(costs, probs, a)
    assert math.isclose(got, want, rel_tol=1e-9), (got, want)
    # Bracketed by the next survivor's remaining cost and the full-horizon expectation.
    first = next(c for c in costs if c > a)
    surv = [(c, q) for c, q in zip(costs, probs, strict=True) if c > a]
    mean_rem = math.fsum(q * (c - a) for c, q in surv) / math.fsum(q for _, q in surv)
    assert (first - a) * (1 - 1e-9) <= got <= mean_rem * (1 + 1e-9)


# --- boundaries and the quantised cache ---------------------------------------------------------
def test_boundaries_are_zero_support_and_buckets() -> None:
    d = LengthDistribution((5, 40, 100), (0.3, 0.3, 0.4))
    assert boundaries_tokens(d, 16) == [0, 5, 16, 32, 40, 64, 100]
    assert boundaries_tokens(d, None) == [0, 5, 40, 100]
    with pytest.raises(ValueError):
        boundaries_tokens(d, 0)


def test_next_boundary_continues_in_buckets_past_the_support() -> None:
    d = LengthDistribution((5, 40, 100), (0.3, 0.3, 0.4))
    t = GittinsTable(d, 10, base=16)
    assert [t.next_boundary(g) for g in (0, 5, 39, 64, 99, 100, 127, 128)] == [
        5,
        16,
        40,
        100,
        100,
        128,
        128,
        256,
    ]
    assert GittinsTable(d, 10, base=None).next_boundary(100) is None


def test_length_only_ranks_by_tokens() -> None:
    d = LengthDistribution((10, 100), (0.5, 0.5))
    t = GittinsTable(d, 5000, length_only=True, base=None)
    assert t.rank_at(0) == pytest.approx(20.0)  # the two-point example above, in tokens
    assert t.rank_at(10) == pytest.approx(90.0)


@st.composite
def token_dists(draw: st.DrawFn) -> tuple[LengthDistribution, int, int | None]:
    support = sorted(draw(st.lists(st.integers(1, 400), min_size=1, max_size=24, unique=True)))
    probs = draw(st.lists(st.floats(1e-4, 1.0), min_size=len(support), max_size=len(support)))
    total = math.fsum(probs)
    dist = LengthDistribution(tuple(support), tuple(p / total for p in probs))
    prompt = draw(st.integers(0, 20000))
    base = draw(st.sampled_from([None, 1, 3, 16, 64]))
    return dist, prompt, base


@settings(max_examples=150, deadline=None)
@given(token_dists())
def test_rank_changes_only_at_boundaries(case: tuple[LengthDistribution, int, int | None]) -> None:
    dist, prompt, base = case
    table = GittinsTable(dist, prompt, base=base)
    costs, probs = cost_support(dist, prompt), dist.probs
    horizon = 2 * dist.support[-1] + 130
    expected = {0, *dist.support}
    if base is not None:
        b = base
        while b <= horizon:
            expected.add(b)
            b *= 2

    tracker = GittinsTracker(table, 0)
    floor = 0
    cached = gittins_rank(costs, probs, service_cost(prompt, 0))
    assert tracker.rank == cached
    for g in range(1, horizon + 1):
        crossed = tracker.update(g)
        assert crossed == (g in expected), g
        if g in expected:
            floor = g
            cached = gittins_rank(costs, probs, service_cost(prompt, g))
        # Between boundaries the rank is the value cached at the last one, exactly.
        assert table.rank_at(g) == cached
        assert tracker.rank == cached
        assert table.boundary_floor(g) == floor


def test_tracker_reset_handles_going_back() -> None:
    d = LengthDistribution((20, 200), (0.5, 0.5))
    table = GittinsTable(d, 100)
    tr = GittinsTracker(table, 150)
    assert tr.rank == table.rank_at(150)
    assert not tr.update(151)
    tr.reset(0)
    assert tr.rank == table.rank_at(0) and tr.next_at == 16
