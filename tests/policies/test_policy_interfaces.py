"""The small interfaces of ``policies.interfaces``: every registered policy implements each one it is
used through (members present, with the protocol's parameters), each group of ``Policy``'s defaults
implements its own alone, and an object that is no ``Policy`` drives the queue and the dispatch loop
through them."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.base import (
    ADMIT,
    EngineDefaults,
    HookDefaults,
    LaneDefaults,
    LoadView,
    OrderDefaults,
    Policy,
    SchedRequest,
    ScreenDefaults,
    Screening,
    fcfs_tiebreak,
)
from sagegate.policies.capabilities import Capability
from sagegate.policies.dispatch_loop import DecisionKind, DispatchLoop
from sagegate.policies.interfaces import (
    Displacement,
    EngineKnobs,
    EnginePolicy,
    GatewayPolicy,
    LaneOrder,
    PolicyHooks,
    QueueOrder,
    Screen,
)
from sagegate.policies.queue import PolicyQueue
from sagegate.policies.registry import parse_policy, registry

PROTOCOLS = (
    QueueOrder,
    LaneOrder,
    Screen,
    Displacement,
    EngineKnobs,
    PolicyHooks,
    GatewayPolicy,
    EnginePolicy,
)
SPECS = [*sorted(registry()), "sagesched:max_wait_s=5"]


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    """The protocol's methods (its own and inherited), by name, with their signatures."""
    out = {}
    for klass in reversed(protocol.__mro__):
        for name, member in vars(klass).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                out[name] = inspect.signature(member)
    return out


@pytest.mark.parametrize("spec", SPECS)
def test_every_registered_policy_implements_the_protocols_it_is_used_through(spec: str) -> None:
    policy = parse_policy(spec)
    for protocol in PROTOCOLS:
        assert isinstance(policy, protocol), f"{spec} is no {protocol.__name__}"
        for name, sig in _methods(protocol).items():
            own = inspect.signature(getattr(policy, name))
            assert list(own.parameters) == list(sig.parameters)[1:], f"{spec}.{name}{own} vs {sig}"
    assert isinstance(policy.name, str) and policy.name == spec.split(":")[0]
    assert all(isinstance(c, Capability) for c in policy.capabilities)
    assert 0.0 < policy.max_preempt_share <= 1.0


@pytest.mark.parametrize(
    ("defaults", "protocol"),
    [
        (OrderDefaults, QueueOrder),
        (LaneDefaults, LaneOrder),
        (ScreenDefaults, Screen),
        (EngineDefaults, EngineKnobs),
        (HookDefaults, PolicyHooks),
    ],
)
def test_each_group_of_defaults_implements_its_protocol_alone(defaults: type, protocol: type) -> None:
    assert isinstance(defaults(), protocol)
    assert issubclass(Policy, defaults)


def test_the_defaults_are_fcfs() -> None:
    a, b = SchedRequest("a", 1.0, 10), SchedRequest("b", 2.0, 10)
    policy = Policy()
    assert policy.key(a, 5.0) == fcfs_tiebreak(a)
    assert policy.pick_victim([a, b], 5.0) is b
    assert policy.screen(a, 5.0, LoadView()) is ADMIT


class ShortestPrompt:
    """A queue order that is no ``Policy``: only what :class:`QueueOrder` asks."""

    name = "shortest-prompt"
    capabilities: frozenset[Capability] = frozenset()

    def key(self, req: SchedRequest, now: float) -> Any:
        return (req.prompt_tokens, *fcfs_tiebreak(req))

    def engine_rank(self, req: SchedRequest) -> float | None:
        return float(req.prompt_tokens)


class LeastWaited(ShortestPrompt):
    """A dynamic order (the key moves with the clock): the queue scans instead of keeping a heap."""

    capabilities = frozenset({Capability.DYNAMIC_KEY})

    def key(self, req: SchedRequest, now: float) -> Any:
        return (-(now - req.arrival_s) // 10, req.prompt_tokens, *fcfs_tiebreak(req))


def _requests() -> list[SchedRequest]:
    return [SchedRequest(i, float(i), p) for i, p in enumerate([300, 20, 100, 20, 5])]


@pytest.mark.parametrize("order", [ShortestPrompt(), LeastWaited()])
def test_a_bare_queue_order_drives_the_policy_queue(order: QueueOrder) -> None:
    assert isinstance(order, QueueOrder) and not isinstance(order, Policy)
    reqs = _requests()
    queue: PolicyQueue[SchedRequest] = PolicyQueue(order)
    for r in reqs:
        queue.push(r, 5.0)
    expected = sorted(reqs, key=lambda r: order.key(r, 5.0))
    assert [r.rid for r in expected] == [4, 1, 3, 2, 0]
    assert queue.ordered(5.0) == expected
    assert queue.remove(reqs[4]) and queue.peek(5.0) is reqs[1]
    assert [queue.pop(5.0) for _ in range(len(queue))] == expected[1:]


def test_declaring_lanes_without_the_lane_methods_is_refused() -> None:
    class NoLanes(ShortestPrompt):
        capabilities = frozenset({Capability.DYNAMIC_KEY, Capability.LANE_KEY})

    with pytest.raises(TypeError, match="LANE_KEY without the lane methods"):
        PolicyQueue(NoLanes())
    PolicyQueue(NoLanes(), scan=True)  # a scan needs only the key


class BareGatewayPolicy(ShortestPrompt):
    """What :class:`GatewayPolicy` asks and nothing more, keeping a log of the hooks."""

    reject_reasons: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening:
        return ADMIT

    def may_preempt(self, victim: SchedRequest, now: float) -> bool:
        return True

    def expected_remaining(self, req: SchedRequest) -> float:
        return 1.0

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self.log.append(("arrival", req.rid))

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        self.log.append(("dispatch", req.rid))

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        self.log.append(("progress", req.rid))

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        self.log.append(("preempt", req.rid))

    def on_finish(self, req: SchedRequest, now: float) -> None:
        self.log.append(("finish", req.rid))

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        self.log.append(("repredict", req.rid))


class _Driver:
    """One backend that admits any request (an idle backend admits whatever its charge)."""

    def __init__(self) -> None:
        self.loads = [BackendLoad(capacity_tokens=1 << 20)]
        self.sent: list[Any] = []

    def charge(self, req: SchedRequest) -> Charge:
        return Charge(req.prompt_tokens, None, AdmissionConfig())

    def allowed(self, req: SchedRequest) -> Sequence[bool] | None:
        return None

    def cached(self, req: SchedRequest) -> None:
        return None

    def dispatched(self, req: SchedRequest, backend: int, charge: Charge, now: float) -> None:
        self.sent.append(req.rid)

    def refused(self, req: SchedRequest, reason: str) -> None:
        raise AssertionError(f"refused {req.rid}: {reason}")

    def running(self, backend: int) -> Sequence[tuple[SchedRequest, Charge]]:
        return []

    def pause(self, req: SchedRequest, now: float) -> bool:
        return False


def test_a_bare_gateway_policy_drives_the_dispatch_loop() -> None:
    policy = BareGatewayPolicy()
    assert isinstance(policy, GatewayPolicy) and not isinstance(policy, EnginePolicy)
    queue: PolicyQueue[SchedRequest] = PolicyQueue(policy)
    driver = _Driver()
    loop = DispatchLoop(policy, AdmissionConfig(), queue, driver, capacity_requests=4)
    loop.log = []
    for r in _requests():
        policy.on_arrival(r, 5.0)
        queue.push(r, 5.0)
    result = loop.run(5.0)
    assert result.dispatched == 5 and result.stop is None and not queue
    assert driver.sent == [4, 1, 3, 2, 0]
    assert [d.kind for d in loop.log] == [DecisionKind.DISPATCH] * 5
    assert [e for e in policy.log if e[0] == "dispatch"] == [("dispatch", rid) for rid in driver.sent]
