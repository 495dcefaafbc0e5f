"""The placement plugins: the default profile is the cache-aware rule exactly, a scorer enabled from
the config file with a weight changes decisions as its weight says, bad names fail at start-up."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sagegate.gateway.settings import GatewaySettings, load_settings
from sagegate.policies.admission import (
    AdmissionConfig,
    BackendLoad,
    Charge,
    choose_backend,
    eligible,
    shared_charges,
)
from sagegate.policies.placement import (
    INCUMBENT_PROFILE,
    CacheView,
    Placement,
    PlacementKind,
    build_profile,
    choose_placement,
    classify,
)
from sagegate.policies.placement.plugins import PlacementQuery


# --- the rule, as documented (policies.placement), written out plainly as the reference ---------------
def reference(
    charge: Charge,
    loads: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    prompt: int,
    allowed: Sequence[bool] | None,
    view: CacheView | None,
) -> Placement:
    per = shared_charges(charge, loads)

    def on(i: int) -> Charge:
        return charge if per is None else per[i]

    def placed(i: int | None, cached: int = 0, kind: PlacementKind = PlacementKind.NO_HIT) -> Placement:
        return Placement(i, cached, kind, per[i] if per is not None and i is not None else None)

    default = choose_backend(charge if per is None else per, loads, cfg, prompt, allowed)
    if view is None:
        return placed(default)
    cached = view.hits
    if max(cached, default=0) <= 0:
        if default is None:
            return Placement(None)
        room, best = loads[default].room(cfg.target), default
        for i, b in enumerate(loads):
            tied = view.held[i] < view.held[best] and b.room(cfg.target) == room
            if tied and eligible(b, i, cfg, prompt, allowed) and b.admits(on(i), cfg):
                best = i
        return placed(best)
    best, best_score = default, -math.inf
    if default is not None:
        best_score = cached[default] - loads[default].queued_prefill
    floor = cached[default] if default is not None else 0
    for i, b in enumerate(loads):
        if i == default or cached[i] <= floor or not eligible(b, i, cfg, prompt, allowed, cached[i]):
            continue
        s = cached[i] - b.queued_prefill
        if s > best_score and b.admits(on(i), cfg):
            best, best_score = i, s
    if best is None:
        return Placement(None)
    return placed(best, cached[best], classify(cached, best))


backend_state = st.tuples(
    st.sampled_from([0, 0, 1000, 2000, 5000, 9000]),  # charged: repeats make ties in room
    st.integers(0, 4),  # waiting
    st.sampled_from([0, 300, 1500, 2500]),  # waiting tokens
    st.sampled_from([0, 0, 700]),  # another replica's waiting tokens
    st.booleans() | st.just(True),  # healthy
    st.sampled_from([0.0, 0.25, 0.9]),  # prefix hit ratio
    st.sampled_from([0, 0, 128, 300, 1024, 1500, 2048]),  # predicted cached prompt tokens (ties in score)
    st.sampled_from([0, 4000, 9000]),  # predicted held tokens
    st.booleans() | st.just(True),  # allowed
)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(backend_state, min_size=1, max_size=5),
    st.integers(1, 3000),
    st.sampled_from([None, "view"]),
    st.booleans(),
    st.sampled_from(["peak", "sum"]),
    st.sampled_from([2, 256]),
)
def test_the_incumbent_profile_is_the_documented_rule_exactly(
    states: list[tuple], prompt: int, with_view: str | None, mask: bool, rule: str, max_waiting: int
) -> None:
    cfg = AdmissionConfig(rule=rule, max_waiting=max_waiting)  # type: ignore[arg-type]
    loads, hits, held, allowed = [], [], [], []
    for charged, waiting, wt, foreign, healthy, ratio, hit, hold, ok in states:
        load = BackendLoad(10_000, waiting=waiting, waiting_tokens=wt, foreign_waiting_tokens=foreign)
        load.healthy, load.prefix_hit_ratio = healthy, ratio
        if charged:
            load.charge(Charge(charged, None, cfg))
        loads.append(load)
        hits.append(min(hit, prompt - 1) if prompt > 1 else 0)
        held.append(hold)
        allowed.append(ok)
    view = CacheView(hits, held) if with_view else None
    charge = Charge(prompt, None, cfg)
    mask_or_none = allowed if mask else None
    want = reference(charge, loads, cfg, prompt, mask_or_none, view)
    assert INCUMBENT_PROFILE.place(charge, loads, cfg, prompt, mask_or_none, view) == want
    by_name = build_profile(picker="incumbent")  # its scorers the picker's own
    assert by_name.place(charge, loads, cfg, prompt, mask_or_none, view) == want


# --- a scorer enabled from the config file with a weight -----------------------------------------------
def _idle_pair() -> list[BackendLoad]:
    """Two backends with the same room; the second runs more requests."""
    return [BackendLoad(10_000, running=1), BackendLoad(10_000, running=6)]


def test_a_scorer_named_in_the_config_file_with_a_weight_changes_the_choice(tmp_path: Path) -> None:
    cfg = AdmissionConfig()
    loads = _idle_pair()
    loads.reverse()  # the busier one first: the most-room rule takes the first on a tie
    charge = Charge(500, None, cfg)
    view = CacheView([0, 0], [0, 0])
    assert choose_placement(charge, loads, cfg, 500, None, view).backend == 0
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "placement:\n  profile:\n    picker: max_score\n    scorers: {room: 1, fewest_running: 1}\n"
    )
    assert (
        load_settings(config).placement.profile.build().place(charge, loads, cfg, 500, None, view).backend
        == 1
    )
    # weighted: a prefix hit worth more than the running count's weight wins back the busier backend
    hot = CacheView([1024, 0], [1024, 0])
    fewest = build_profile({"fewest_running": 1.0, "prefix_hit": 0.5}, "max_score")
    assert fewest.place(charge, loads, cfg, 500, None, hot).backend == 1
    prefix = build_profile({"fewest_running": 1.0, "prefix_hit": 2.0}, "max_score")
    assert prefix.place(charge, loads, cfg, 500, None, hot).backend == 0


def test_max_score_never_goes_where_the_rule_does_not_admit() -> None:
    cfg = AdmissionConfig()
    full = BackendLoad(10_000)
    full.charge(Charge(14_900, None, cfg))  # no room for 500 more under the target
    loads = [full, BackendLoad(10_000, running=9)]
    profile = build_profile({"prefix_hit": 100.0, "fewest_running": 1.0}, "max_score")
    placed = profile.place(Charge(500, None, cfg), loads, cfg, 500, None, CacheView([400, 0], [400, 0]))
    assert placed.backend == 1 and placed.kind is PlacementKind.BROKE_AWAY
    assert profile.place(Charge(500, None, cfg), loads, cfg, 500, [True, False], None).backend is None


def test_max_score_bounds_a_cold_backend_s_backlog_by_whole_prompts() -> None:
    """Another backend's hit does not loosen a cold backend's waiting-tokens bound (it counts whole
    prompts there, as the most-room rule does)."""
    cfg = AdmissionConfig(max_waiting_tokens=1000)
    cold = BackendLoad(10_000, waiting=1, waiting_tokens=900, prefix_hit_ratio=0.9)  # 900 + 500 > 1000
    warm = BackendLoad(10_000, charged_tokens=9000)
    profile = build_profile({"room": 1.0}, "max_score")
    placed = profile.place(
        Charge(500, None, cfg), [cold, warm], cfg, 500, None, CacheView([0, 200], [0, 200])
    )
    assert placed.backend == 1


class Explodes:
    def __init__(self) -> None:
        raise RuntimeError("no licence server")


class OnlyEven:
    """A filter from outside the package (``module:Class``): only even-numbered backends."""

    def keep(self, q: PlacementQuery, i: int, cached: int | None) -> bool:
        return i % 2 == 0


def test_a_filter_from_outside_the_package_is_loaded_by_its_path() -> None:
    cfg = AdmissionConfig()
    loads = [
        BackendLoad(10_000, charged_tokens=5000),
        BackendLoad(10_000),
        BackendLoad(10_000, charged_tokens=100),
    ]
    profile = build_profile(picker="incumbent", filters=[f"{__name__}:OnlyEven"])
    assert INCUMBENT_PROFILE.place(Charge(500, None, cfg), loads, cfg, 500, None, None).backend == 1
    assert profile.place(Charge(500, None, cfg), loads, cfg, 500, None, None).backend == 2


INC = "incumbent"
"""A picker that weighs scorers (the default, ``forecast``, refuses them)."""


@pytest.mark.parametrize(
    ("profile", "says"),
    [
        ({"picker": INC, "scorers": {"prefix_hits": 1}}, "unknown placement scorer 'prefix_hits'"),
        ({"picker": "best"}, "unknown placement picker 'best'"),
        ({"picker": INC, "scorers": {"room": float("inf")}}, "weight must be finite"),
        ({"picker": INC, "scorers": {"no.such.module:Scorer": 1}}, "could not be made"),
        ({"filters": [f"{__name__}:reference"]}, "could not be made"),
        ({"filters": ["sagegate.gateway.settings:GatewaySettings"]}, "has no keep() method"),
        ({"picker": INC, "scorers": {f"{__name__}:Explodes": 1}}, "could not be made: no licence server"),
        ({"picker": INC, "scorers": {}}, "at least one needs a non-zero weight"),
        ({"picker": INC, "scorers": {"room": 0, "prefix_hit": 0}}, "at least one needs a non-zero weight"),
        ({"scorers": {"prefix_hit": 1}}, "placement picker 'forecast' reads no scorers (prefix_hit)"),
    ],
)
def test_a_bad_profile_is_refused_at_start_up_with_what_exists(profile: dict, says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        GatewaySettings(placement={"profile": profile})


def test_a_tie_in_score_keeps_the_most_room_choice() -> None:
    """Holding 300 more tokens of the prompt behind 300 queued ones is no better: it stays."""
    cfg = AdmissionConfig()
    loads = [BackendLoad(10_000), BackendLoad(10_000, waiting=1, waiting_tokens=300, charged_tokens=10)]
    charge = Charge(500, None, cfg)
    even = CacheView([0, 300], [0, 300])
    assert choose_placement(charge, loads, cfg, 500, None, even).backend == 0
    better = CacheView([0, 301], [0, 301])
    assert choose_placement(charge, loads, cfg, 500, None, better).backend == 1
    # nothing cached: equal room, the emptier cache; equal caches, the first
    idle = [BackendLoad(10_000), BackendLoad(10_000), BackendLoad(10_000)]
    assert choose_placement(charge, idle, cfg, 500, None, CacheView([0] * 3, [5, 3, 3])).backend == 1
