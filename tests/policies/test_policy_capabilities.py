"""Policies declare what they do (``capabilities``) and their parameters' bounds (``Range``); the
declarations are checked once, and the drivers' skips are safe only if every hook a policy
overrides is declared, which this file checks for the whole registered panel."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

from sagegate.policies.base import ENGINE, GATEWAY, Capability, Policy
from sagegate.policies.params import Positive, Range, checked
from sagegate.policies.registry import PolicySpecError, parse_policy, registry

# Each hook a driver may skip, with the capability that tells it not to.
HOOK_CAPABILITY = {
    "screen": Capability.SCREEN,
    "on_progress": Capability.PROGRESS_HOOK,
    "defer_decode": Capability.DEFER_DECODE,
    "may_preempt": Capability.PREEMPT,
}
LANE_HOOKS = ("place", "primary")  # flipped/after_flip only when a placement flips

# Every registered policy at its defaults, and the parameters that change a declaration.
SPECS = [*sorted(registry()), "sagesched:preempt=false", "sagesched:max_wait_s=5", "mean-cost:preempt=false"]


def _overrides(policy: Policy, hook: str) -> bool:
    return getattr(type(policy), hook) is not getattr(Policy, hook)


@pytest.mark.parametrize("spec", SPECS)
def test_every_overridden_hook_is_declared(spec: str) -> None:
    policy = parse_policy(spec)
    for hook, capability in HOOK_CAPABILITY.items():
        if capability is Capability.PREEMPT and spec.endswith("preempt=false"):
            continue  # preemption turned off: the hook stays, the engine no longer asks
        if _overrides(policy, hook):
            assert capability in policy.capabilities, f"{spec} overrides {hook} without {capability.name}"


@pytest.mark.parametrize("spec", SPECS)
def test_declared_hooks_are_implemented(spec: str) -> None:
    policy = parse_policy(spec)
    for hook, capability in HOOK_CAPABILITY.items():
        if capability in policy.capabilities and capability is not Capability.PREEMPT:
            assert _overrides(policy, hook), f"{spec} declares {capability.name} but keeps the default {hook}"
    if Capability.LANE_KEY in policy.capabilities:
        assert all(_overrides(policy, h) for h in LANE_HOOKS), spec


def test_panel_declarations() -> None:
    caps = {name: info.cls.capabilities for name, info in registry().items()}
    assert {n for n, c in caps.items() if Capability.SCREEN in c} == {
        "kv-constrained",
        "admission-control",
        "scorpio-guard",
    }
    assert {n for n, c in caps.items() if Capability.USES_ORACLE in c} == {"sjf-oracle", "srpt-oracle"}
    arrival = {n for n, c in caps.items() if Capability.ARRIVAL_ORDER in c}
    assert arrival == {"fcfs", "vllm-v0", "vllm-v1", "sarathi"}
    assert Capability.DYNAMIC_KEY not in caps["sagesched"]
    aging = parse_policy("sagesched:max_wait_s=5").capabilities
    assert {Capability.DYNAMIC_KEY, Capability.LANE_KEY} <= aging


def test_declaration_is_checked_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="LANE_KEY requires DYNAMIC_KEY"):

        class _LanesOnly(Policy):
            capabilities = frozenset({Capability.LANE_KEY})

    with pytest.raises(TypeError, match="SCREEN needs the gateway level"):

        class _EngineScreen(Policy):
            levels = frozenset({ENGINE})
            capabilities = frozenset({Capability.SCREEN})

    with pytest.raises(TypeError, match="PREEMPT need the engine level"):

        class _GatewayPreempt(Policy):
            levels = frozenset({GATEWAY})
            capabilities = frozenset({Capability.PREEMPT})

    with pytest.raises(TypeError, match="max_preempt_share without PREEMPT"):

        class _ShareOnly(Policy):
            max_preempt_share = 0.5

    with pytest.raises(TypeError, match="reject_reasons without SCREEN"):

        class _Reasons(Policy):
            reject_reasons = frozenset({"no"})


def test_an_instance_declaration_is_checked_too() -> None:
    policy = parse_policy("vtc")  # gateway only
    with pytest.raises(TypeError, match="engine level"):
        policy.declare(policy.capabilities | {Capability.REKEY_ON_PROGRESS})
    assert Capability.REKEY_ON_PROGRESS not in policy.capabilities


class _Bounded(Policy):
    @checked
    def __init__(
        self,
        rate: Positive = 1.0,
        share: Annotated[float, Range(gt=0, le=1)] = 0.5,
        slo: Annotated[float | None, Range(ge=0, note="0 = none")] = None,
    ) -> None:
        self.rate, self.share, self.slo = rate, share, slo


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0.0}, "rate must be positive, got 0.0"),
        ({"rate": float("nan")}, "rate must be positive, got nan"),
        ({"share": 1.5}, "share must be in (0, 1], got 1.5"),
        ({"slo": -1.0}, "slo must be >= 0 (0 = none) or None, got -1.0"),
    ],
)
def test_declared_bounds_are_checked_on_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        _Bounded(**kwargs)
    assert str(err.value) == message


def test_values_inside_the_bounds_build() -> None:
    p = _Bounded(rate=2.0, share=1.0, slo=None)
    assert (p.rate, p.share, p.slo) == (2.0, 1.0, None)
    assert _Bounded(slo=0.0).slo == 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fastserve:queues=0", "queues must be >= 1, got 0"),
        ("fastserve:base_quantum_ms=0", "base_quantum_ms must be positive, got 0.0"),
        ("kv-constrained:kv_threshold=0", "kv_threshold must be in (0, 1], got 0.0"),
        ("kv-constrained:output_weight=-1", "output_weight must be >= 0, got -1.0"),
        ("scorpio-guard:ttft_slo_s=0", "ttft_slo_s must be positive or None, got 0.0"),
        ("admission-control:min_laxity_s=nan", "min_laxity_s must be a number or None, got nan"),
        ("sagesched:buckets=-1", "buckets must be >= 0 (0 = support points only), got -1"),
        ("trail:preempt_limit=1.5", "preempt_limit must be in [0, 1], got 1.5"),
        ("vtc:input_weight=-1", "input_weight must be >= 0, got -1.0"),
    ],
)
def test_spec_errors_name_the_parameter_and_its_bound(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError) as err:
        parse_policy(spec)
    text = str(err.value)
    assert message in text and "valid parameters" in text


def test_the_listing_shows_each_bound() -> None:
    with pytest.raises(PolicySpecError) as err:
        parse_policy("fastserve:nope=1")
    assert "queues: int >= 1 = 8" in str(err.value)
    assert "base_quantum_ms: float positive = 10.0" in str(err.value)


def test_optional_parameters_parse_none_and_numbers() -> None:
    assert parse_policy("scorpio-guard:ttft_slo_s=none").ttft_slo_s is None  # type: ignore[attr-defined]
    assert parse_policy("scorpio-guard:ttft_slo_s=0.5").ttft_slo_s == 0.5  # type: ignore[attr-defined]


def test_bounds_without_the_check_are_refused_at_registration() -> None:
    from sagegate.policies import registry as registry_module

    class _Unchecked(Policy):
        def __init__(self, rate: Positive = 1.0) -> None:
            self.rate = rate

    with pytest.raises(RuntimeError, match="@checked"):
        registry_module._params_of(_Unchecked)
    assert [p.name for p in registry_module._params_of(_Bounded)] == ["rate", "share", "slo"]


GATEWAY_PREDICTING = [
    s
    for s in SPECS
    if Capability.USES_PREDICTION in parse_policy(s).capabilities and GATEWAY in parse_policy(s).levels
]


@pytest.mark.parametrize("spec", GATEWAY_PREDICTING)
def test_a_late_prediction_ranks_as_if_it_had_come_on_time(spec: str) -> None:
    """A request re-predicted while it waits (``on_repredict``, then placed again) gets the key a
    request predicted that way from the start would have: nothing of the old prediction lingers."""
    from sagegate.core.distribution import LengthDistribution
    from sagegate.policies.base import SchedRequest

    early = LengthDistribution((20, 40), (0.5, 0.5))
    late = LengthDistribution((900, 1800), (0.5, 0.5))

    def waiting(pred: LengthDistribution) -> tuple[Policy, SchedRequest]:
        policy = parse_policy(spec)
        req = SchedRequest(7, 1.0, 300, prediction=pred, deadline_s=60.0)
        policy.on_arrival(req, 1.0)
        policy.key(req, 1.0)  # whatever the policy derives, it has derived it
        return policy, req

    policy, req = waiting(early)
    before = policy.key(req, 2.0)
    req.prediction = late
    policy.on_repredict(req, 2.0)
    fresh_policy, fresh = waiting(late)
    assert policy.key(req, 2.0) == fresh_policy.key(fresh, 2.0)
    assert policy.key(req, 2.0) != before  # and it did re-rank
