"""The policy registry: the whole panel is there, specs parse with typed parameters, and every bad
spec fails with a message that lists what is valid."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from sagegate.policies.base import ENGINE, GATEWAY, Capability, Policy
from sagegate.policies.registry import PolicySpecError, names, parse_policy, registry

# The panel as issue 3 lists it; checked against the panel table of docs/design/policies.md below.
PANEL = [
    "fcfs",
    "random",
    "sjf-oracle",
    "srpt-oracle",
    "ssjf",
    "ltr",
    "trail",
    "fastserve",
    "sagesched",
    "gittins-length",
    "mean-cost",
    "edf",
    "llf",
    "estf",
    "vtc",
    "wfs",
    "kv-constrained",
    "admission-control",
    "scorpio-guard",
    "vllm-v0",
    "vllm-v1",
    "sarathi",
    "slai",
]


def table_names(text: str) -> list[str]:
    """Policy names in the first column of the panel table of docs/design/policies.md (back-quoted)."""
    out: list[str] = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            out.extend(re.findall(r"`([a-z0-9-]+)`", cells[1]))
    return out


def test_panel_matches_the_policies_doc():
    text = (REPO / "docs" / "design" / "policies.md").read_text(encoding="utf-8")
    assert sorted(table_names(text)) == sorted(PANEL)


@pytest.mark.parametrize("name", PANEL)
def test_every_panel_policy_is_registered_and_builds_with_defaults(name):
    assert name in names()
    policy = parse_policy(name)
    assert isinstance(policy, Policy)
    assert policy.name == name
    assert policy.levels and policy.levels <= {GATEWAY, ENGINE}
    info = registry()[name]
    assert info.summary, "the docstring's first line is the policy's summary"


def test_levels_follow_the_table():
    reg = registry()
    for name in ("vtc", "wfs", "kv-constrained", "admission-control", "scorpio-guard"):
        assert reg[name].cls.levels == {GATEWAY}, name
    for name in ("vllm-v0", "vllm-v1", "sarathi", "slai"):
        assert reg[name].cls.levels == {ENGINE}, name
    for name in ("sjf-oracle", "srpt-oracle", "ssjf", "ltr", "trail", "fastserve", "sagesched", "edf"):
        assert reg[name].cls.levels == {GATEWAY, ENGINE}, name


def test_typed_parameters_are_coerced():
    p = parse_policy("fastserve:base_quantum_ms=20,queues=4,starvation_s=1.5")
    assert p.base_quantum_s == pytest.approx(0.020)  # type: ignore[attr-defined]
    assert p.queues == 4 and isinstance(p.queues, int)  # type: ignore[attr-defined]
    s = parse_policy("sagesched:buckets=32,preempt=false")
    assert s.bucket_base == 32  # type: ignore[attr-defined]
    assert Capability.PREEMPT not in s.capabilities
    assert Capability.PREEMPT in parse_policy("sagesched").capabilities
    a = parse_policy("admission-control:min_laxity_s=none")
    assert a.min_laxity_s is None  # type: ignore[attr-defined]
    assert parse_policy("admission-control:min_laxity_s=0.5").min_laxity_s == 0.5  # type: ignore[attr-defined]
    assert parse_policy("trail", preempt_limit=0.5).preempt_limit == 0.5  # type: ignore[attr-defined]


def test_published_defaults():
    f = parse_policy("fastserve")
    assert f.base_quantum_s == pytest.approx(0.010) and f.starvation_s == 3.0  # type: ignore[attr-defined]
    t = parse_policy("trail")
    assert t.preempt_limit == 0.8 and t.max_preempt_share == 0.5  # type: ignore[attr-defined]
    v = parse_policy("vtc")
    assert (v.tenants.input_weight, v.tenants.output_weight) == (1.0, 2.0)  # type: ignore[attr-defined]
    k = parse_policy("kv-constrained")
    assert (k.kv_threshold, k.urgent_laxity_s, k.output_weight) == (0.82, 0.25, 0.25)  # type: ignore[attr-defined]
    g = parse_policy("scorpio-guard")
    assert (g.kv_threshold, g.queue_factor) == (0.65, 3.0)  # type: ignore[attr-defined]
    assert parse_policy("slai").engine_chunk_size == 512
    assert parse_policy("sarathi").engine_chunk_size == 512
    assert parse_policy("admission-control").min_laxity_s is None  # type: ignore[attr-defined]
    e = parse_policy("estf")
    assert (e.prompt_weight, e.output_weight) == (0.5, 1.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "must_mention"),
    [
        ("sagesched:buckets=-1", ["buckets", "max_points", "preempt"]),
        ("sagesched:max_points=0", ["max_points"]),
        ("fastserve:base_quantum_ms=-5", ["base_quantum_ms", "starvation_s"]),
        ("trail:preempt_limit=1.5", ["preempt_limit"]),
        ("kv-constrained:kv_threshold=0", ["kv_threshold"]),
        ("ltr:starvation_rounds=0", ["starvation_rounds"]),
        ("slai:tpot_slo_s=0", ["tpot_slo_s"]),
        ("vtc:output_weight=-1", ["output_weight"]),
    ],
)
def test_invalid_values_fail_listing_the_parameters(spec, must_mention):
    with pytest.raises(PolicySpecError) as err:
        parse_policy(spec)
    msg = str(err.value)
    assert "valid parameters" in msg
    for word in must_mention:
        assert word in msg


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(PolicySpecError) as err:
        parse_policy("sagesched:bucket=16")
    assert "bucket'" in str(err.value) and "buckets" in str(err.value) and "max_points" in str(err.value)


def test_untyped_value_fails_listing_the_parameters():
    with pytest.raises(PolicySpecError) as err:
        parse_policy("fastserve:queues=many")
    assert "queues" in str(err.value) and "valid parameters" in str(err.value)


def test_unknown_policy_lists_every_valid_name():
    with pytest.raises(PolicySpecError) as err:
        parse_policy("sagesched2")
    msg = str(err.value)
    for name in PANEL:
        assert name in msg
