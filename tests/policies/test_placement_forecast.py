"""The ``forecast`` picker: the backend where the request's last token is forecast soonest, counting
what its prefill and its place in the batch cost the requests already there; a warm backend that
cannot take it now is waited for when that still forecasts sooner."""

from __future__ import annotations

import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.base import SchedRequest
from sagegate.policies.engine_speed import EngineSpeed
from sagegate.policies.placement import CacheView, build_profile
from sagegate.policies.placement.forecast import Forecast
from sagegate.policies.placement.profile import PlacementProfile

CFG = AdmissionConfig(max_waiting=1000, max_waiting_tokens=10**9)
PROMPT = 7168
WARM = CacheView([6144, 0], [6144, 0])  # its 6,144-token system prompt is cached on backend 0


def request(out: int = 200) -> SchedRequest:
    return SchedRequest(1, 0.0, PROMPT, prediction=LengthDistribution.from_samples([out]))


def place(
    loads: list[BackendLoad], view: CacheView | None = WARM, out: int = 200, **kw: object
) -> int | None:
    profile = PlacementProfile(picker=Forecast(**kw))  # type: ignore[arg-type]
    return profile.place(Charge(PROMPT, None, CFG), loads, CFG, PROMPT, None, view, request(out)).backend


def busy(running: int, waiting_tokens: int = 0, waiting: int = 0) -> BackendLoad:
    return BackendLoad(10**7, running=running, waiting=waiting, waiting_tokens=waiting_tokens)


def test_a_follower_stays_with_its_prefix_where_recomputing_it_would_slow_everyone() -> None:
    """The warm backend has a prefill queued and more running: alone, the request would finish
    sooner on the idle one, but recomputing 6,144 tokens there delays the requests already running
    there; counting that, it stays, as vllm-router ``cache_aware`` does."""
    loads = [busy(30, waiting_tokens=7168, waiting=1), busy(20)]
    assert place(loads, delay_others=False) == 1  # the request alone: the emptier backend
    assert place(loads) == 0


def test_a_much_busier_warm_backend_is_left_for_a_cold_one() -> None:
    """Sixty requests more in its batch slow the request's own decode more than its prefill saves."""
    assert place([busy(90), busy(2)], out=400) == 1
    assert place([busy(30), busy(20)], out=400) == 0


def test_with_nothing_cached_it_goes_where_the_batch_and_the_queue_are_shortest() -> None:
    loads = [busy(10, waiting_tokens=4000, waiting=1), busy(10), busy(12)]
    assert place(loads, view=CacheView([0, 0, 0], [0, 0, 0])) == 1
    assert place(loads, view=None) == 1


def test_a_warm_backend_whose_memory_frees_soon_is_waited_for() -> None:
    """The warm backend has no room now, but a running request there ends within a few steps: the
    picker holds the request for it (None) rather than recompute the prefix on the idle backend;
    when that wait is long, it goes to the idle one."""
    cfg_peak = AdmissionConfig(max_waiting=1000, max_waiting_tokens=10**9)

    def warm_full(remaining: int) -> BackendLoad:
        b = BackendLoad(20_000, running=1)
        b.charge(Charge(19_000, LengthDistribution.from_samples([remaining]), cfg_peak))
        return b

    def decide(b: BackendLoad) -> int | None:
        profile = PlacementProfile(picker=Forecast())
        loads = [b, BackendLoad(20_000, running=40)]
        return profile.place(
            Charge(PROMPT, None, cfg_peak), loads, cfg_peak, PROMPT, None, WARM, request()
        ).backend

    assert decide(warm_full(3)) is None  # it waits for the warm one
    assert decide(warm_full(3000)) == 1  # too long a wait: the cold one now
    assert (
        PlacementProfile(picker=Forecast(wait=False))
        .place(
            Charge(PROMPT, None, cfg_peak),
            [warm_full(3), BackendLoad(20_000)],
            cfg_peak,
            PROMPT,
            None,
            WARM,
            request(),
        )
        .backend
        == 1
    )


def test_the_engine_speed_sets_the_break_even() -> None:
    """Prefill cheap against decode (a fast prefill engine): the batch weighs more, and a warm but
    busier backend is left sooner."""
    loads = [busy(50), busy(20)]
    assert place(loads) == 0
    assert place(loads, speed=EngineSpeed(prefill_s=1e-7)) == 1


def test_it_is_the_default_and_weighs_no_scorers() -> None:
    """The default profile (from no names, and from the settings' defaults) forecasts; it carries no
    scorers, and naming some beside it is refused rather than silently ignored."""
    from sagegate.gateway.settings import GatewaySettings

    assert isinstance(build_profile().picker, Forecast) and build_profile().scorers == ()
    assert isinstance(GatewaySettings().placement.profile.build().picker, Forecast)
    with pytest.raises(ValueError, match="reads no scorers"):
        build_profile({"prefix_hit": 1.0}, picker="forecast")


def test_a_backends_learned_speed_is_read_only_when_asked() -> None:
    """Two backends alike but for their speed as learned from their counters: read (``learned``),
    the faster one; by default every backend is read at the assumed speed (the first on the tie)."""
    slow, fast = busy(10), busy(10)
    slow.speed = EngineSpeed(prefill_s=1e-4, step_s=0.03, per_seq_s=0.0005)
    assert place([slow, fast], view=None, learned=True) == 1
    assert place([slow, fast], view=None) == 0
    fast.speed = EngineSpeed(prefill_s=2e-4, step_s=0.06, per_seq_s=0.001)
    assert place([slow, fast], view=None, learned=True) == 0
