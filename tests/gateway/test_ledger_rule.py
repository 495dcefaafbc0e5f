"""The shared ledger's Lua rule is ``BackendLoad.admits``: on the same generated states — charges of
this replica (some sharing prompt blocks, so that blocks whose payer left stay pinned to the backend),
charges of another replica, either rule — Redis's verdict on a commit is the local rule's."""

from __future__ import annotations

import json
import uuid
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.ledger_parts import RemoteCharge
from sagegate.gateway.ledger_script import LEDGER_LUA
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.placement import choose_placement
from sagegate.policies.resident import PromptBlocks

redis = pytest.importorskip("redis")

BLOCK = 16
CAPACITY = 4000
_private = count(1)

arrivals = st.lists(
    st.tuples(
        st.integers(0, 2),  # the prompt's shared group
        st.integers(1, 40),  # its shared blocks
        st.integers(0, 4),  # its own blocks after them
        st.integers(1, 400),  # predicted output
        st.booleans(),  # it has started (its blocks are computed)
        st.booleans(),  # it leaves before the commit
    ),
    max_size=10,
)


def charge(group: int, shared: int, tail: int, out: int, cfg: AdmissionConfig) -> Charge:
    own = -next(_private)
    ks = [(group, j) for j in range(shared)] + [(own, j) for j in range(tail)]
    return Charge(len(ks) * BLOCK + 5, LengthDistribution((out,), (1.0,)), cfg, PromptBlocks(ks, BLOCK))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arrivals,
    st.lists(st.tuples(st.integers(1, 900), st.integers(0, 400)), max_size=4),  # the other replica's
    st.tuples(st.integers(1, 900), st.integers(1, 400)),  # the commit: prompt, predicted output
    st.sampled_from(["sum", "peak"]),
    st.sampled_from([0.6, 1.0]),
)
def test_redis_admits_what_the_local_rule_admits(
    redis_url: str,
    script: list[tuple[int, int, int, int, bool, bool]],
    others: list[tuple[int, int]],
    new: tuple[int, int],
    rule: str,
    target: float,
) -> None:
    cfg = AdmissionConfig(rule=rule, target=target, peak_target=target)  # type: ignore[arg-type]
    load = BackendLoad(CAPACITY)
    mine: list[Charge] = []
    for group, shared, tail, out, started, leaves in script:
        c = charge(group, shared, tail, out, cfg)
        placed = choose_placement(c, [load], cfg, int(c.held), None, None).charge or c
        load.charge(placed)
        if started:
            load.progress(placed, 1)
        mine.append(placed)
        if leaves:
            load.release(placed)
            mine.remove(placed)
    for h, r in others:
        load.charge(RemoteCharge(h, r))
    fresh = Charge(new[0], LengthDistribution((new[1],), (1.0,)), cfg)

    client = redis.Redis.from_url(redis_url)
    prefix = f"rule-{uuid.uuid4().hex[:8]}"
    limit = cfg.target * CAPACITY if rule == "sum" else cfg.peak_target * CAPACITY

    def call(replica: str, packed: str, commit: list[object]) -> dict[str, object]:
        args = {
            "replica": replica, "lease_ms": 60_000, "prefix": prefix, "backends": ["b"],
            "publish": {"b": packed}, "commit": commit, "read": False, "freed": False,
        }  # fmt: skip
        return json.loads(client.eval(LEDGER_LUA, 0, json.dumps(args)))  # type: ignore[no-any-return]

    try:
        call("other", "".join(f"{h}:{r}," for h, r in others), [])
        packed = "".join(f"{c.held}:{c.remaining}," for c in mine)
        verdict = call(
            "me", packed, [["b", fresh.held, fresh.remaining, limit, rule, load.resident.pinned_tokens]]
        )
        assert verdict["ok"] == [1 if load.admits(fresh, cfg) else 0], (load.resident.pinned_tokens, verdict)
    finally:
        for k in client.scan_iter(f"{prefix}:*"):
            client.delete(k)
        client.close()


def test_the_generated_states_pin_blocks() -> None:
    """The states above do reach blocks pinned to the backend (else the rule's pinned term is untested)."""
    cfg = AdmissionConfig()
    load = BackendLoad(CAPACITY)
    first = charge(1, 20, 0, 10, cfg)
    load.charge(first)
    load.progress(first, 1)
    second = choose_placement(charge(1, 20, 2, 10, cfg), [load], cfg, 357, None, None).charge
    assert second is not None
    load.charge(second)
    load.release(first)
    assert load.resident.pinned_tokens == 20 * BLOCK
