"""The admission rule itself: the projected peak, both rules' verdicts, and the load bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, Holdings, choose_backend

# (prompt, predicted total output, generated so far): with no prediction, a charge's total output is
# ``unknown_output``, so each request is given one through its own config.
Req = tuple[int, int, int]
reqs = st.lists(
    st.tuples(st.integers(1, 400), st.integers(2, 300), st.integers(0, 299)).filter(lambda r: r[2] < r[1]),
    max_size=12,
)


def charge(prompt: int, total: int, generated: int = 0) -> Charge:
    c = Charge(prompt, None, AdmissionConfig(unknown_output=total))
    c.update(generated)
    return c


def brute_peak(items: list[Req]) -> float:
    """Step the future one token at a time: each request holds prompt + generated + t until its end."""
    horizon = max((total - gen for _, total, gen in items), default=0)
    best = 0.0
    for t in range(horizon + 1):
        held = sum(p + g + t for p, total, g in items if total - g >= t)
        best = max(best, held)
    return best


@settings(max_examples=200, deadline=None)
@given(
    reqs,
    st.tuples(st.integers(1, 400), st.integers(2, 300), st.integers(0, 299)).filter(lambda r: r[2] < r[1]),
)
def test_peak_with_matches_stepping_the_future(items: list[Req], new: Req) -> None:
    h = Holdings()
    for p, total, g in items:
        h.add(charge(p, total, g))
    assert h.peak() == pytest.approx(brute_peak(items))
    c = charge(*new)
    assert c.remaining == new[1] - new[2]
    assert h.peak_with(c.value, c.remaining) == pytest.approx(brute_peak([*items, new]))


def test_peak_follows_progress_and_departures() -> None:
    h = Holdings()
    a, b = charge(100, 50), charge(100, 10)
    h.add(a)
    h.add(b)
    assert h.peak() == brute_peak([(100, 50, 0), (100, 10, 0)])  # 220 while both live, then a grows alone
    a.update(20)
    b.update(5)
    h.changed()
    assert h.peak() == brute_peak([(100, 50, 20), (100, 10, 5)])
    h.discard(b)
    assert h.peak() == 150 and len(h) == 1


def test_peak_admits_what_sum_refuses_and_refuses_an_overflow() -> None:
    # A long request far from its end and a short one about to finish: their whole charges (1,400)
    # exceed capacity 1,000, but they never hold more than 800 at once.
    cap = 1000
    load = BackendLoad(cap)
    load.charge(charge(100, 700, 0))  # holds 100, will hold 800
    load.charge(charge(500, 100, 90))  # holds 590, ends in 10 tokens at 600
    newcomer = charge(50, 40)  # ends at 90, 40 tokens from now
    summed = AdmissionConfig(rule="sum", target=1.0)
    peak = AdmissionConfig(rule="peak", peak_target=1.0)
    assert not load.admits(newcomer, summed)
    # With it: 110 + 600 + 60 = 770 when the short one ends, 800 when the long one does.
    assert load.holdings.peak_with(newcomer.value, newcomer.remaining) == 800
    assert load.admits(newcomer, peak)
    big = charge(400, 50)  # would overlap the short one: 110 + 600 + 410 > 1,000
    assert not load.admits(big, peak)
    assert choose_backend(big, [load, BackendLoad(cap)], peak) == 1  # the idle one takes it


def test_a_band_reserve_keeps_room_only_a_higher_band_may_fill() -> None:
    load = BackendLoad(1000)
    load.charge(charge(600, 100))  # holds 600, will hold 700
    newcomer = charge(100, 50)  # with it the peak is 800 (650 + 150, fifty tokens from now)
    reserved = AdmissionConfig(rule="peak", peak_target=1.0, band_reserve=0.25)
    assert load.admits(newcomer, AdmissionConfig(rule="peak").for_band(1))  # no reserve: it fits
    assert not load.admits(newcomer, reserved.for_band(1))  # the default band stops at 750
    assert not load.admits(newcomer, reserved.for_band(0))  # and so does a lower one
    assert load.admits(newcomer, reserved.for_band(2))  # a higher band may fill the reserve
    summed = AdmissionConfig(rule="sum", target=1.0, band_reserve=0.25)
    assert not load.admits(newcomer, summed.for_band(1)) and load.admits(charge(100, 40), summed.for_band(2))


def test_load_bookkeeping_and_an_idle_backend_always_admits() -> None:
    load = BackendLoad(100)
    huge = charge(500, 500)
    assert load.admits(huge, AdmissionConfig())  # larger than any target, but nothing else runs
    load.charge(huge)
    assert load.charged_tokens == 1000 and len(load.holdings) == 1
    load.progress(huge, 600)  # ran past its prediction: the charge follows
    assert load.charged_tokens > 1000
    assert not load.admits(charge(1, 2), AdmissionConfig())
    load.release(huge)
    assert load.charged_tokens == 0.0 and len(load.holdings) == 0


def test_choose_backend_respects_the_mask_and_waiting_bounds() -> None:
    cfg = AdmissionConfig(max_waiting_tokens=100)
    loads = [BackendLoad(1000), BackendLoad(1000), BackendLoad(1000)]
    loads[1].waiting, loads[1].waiting_tokens = 1, 90
    c = charge(20, 10)
    assert choose_backend(c, loads, cfg, 20, allowed=[False, True, True]) == 2
    assert choose_backend(c, loads, cfg, 20, allowed=[False, True, False]) is None  # 90 + 20 > 100


@pytest.mark.parametrize(
    "kwargs",
    [{"rule": "max"}, {"peak_target": 0.0}, {"target": -1.0}, {"quantile": 1.5}, {"band_reserve": 1.0}],
)
def test_config_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AdmissionConfig(**kwargs)  # type: ignore[arg-type]


def test_a_held_answer_is_kept_only_until_something_changes() -> None:
    h = Holdings()
    big, head = charge(900, 50), charge(200, 20)
    h.add(big)
    assert not h.fits(head, 1000) and not h.fits(head, 1000)  # asked again: the same answer
    h.discard(big)
    assert h.fits(head, 1000)
    other = charge(700, 100)
    h.add(other)  # 700 + 20 + 220 at the head's end
    assert h.fits(head, 1000)
    other.update(90)  # grown: 790 + 20 + 220 > 1,000
    h.changed()
    assert not h.fits(head, 1000)
    assert h.peak() == 800  # and a peak read between does not revive a stale answer
    assert not h.fits(head, 1000)
