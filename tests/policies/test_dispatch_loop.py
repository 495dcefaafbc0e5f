"""The live gateway's dispatcher and the simulator's gateway level decide alike.

Both drive ``policies.dispatch_loop.DispatchLoop``; what each adds around it (charges, waiting counts,
health, refusals) must not make them drift. One generated event sequence — arrivals with prompt sizes
and predictions, first bytes, progress, completions, backends going down and up — is played to the
gateway's :class:`Dispatcher` (in process, no HTTP) and to :class:`SimGateway` (with stand-in engines);
after every event both must have taken the same decisions in the same order and hold the same ledgers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.dispatcher import Dispatcher, PauseVerdict
from sagegate.gateway.locality import Locality
from sagegate.gateway.queue import BoundedQueue, DispatchRefused, GatewayRequest
from sagegate.gateway.settings import GatewaySettings, PlacementSettings
from sagegate.policies.admission import RULES, AdmissionConfig, BackendLoad
from sagegate.policies.base import GATEWAY
from sagegate.policies.dispatch_loop import Decision, DecisionKind
from sagegate.policies.pause import PauseConfig
from sagegate.policies.placement import (
    CACHE_AWARE,
    DEFAULT_PROFILE,
    INCUMBENT_PROFILE,
    LEAST_LOADED,
    PLACEMENTS,
    Placement,
    PlacementProfile,
)
from sagegate.policies.registry import names, parse_policy
from sagegate.sim.engine import EngineRequest
from sagegate.sim.engine_request import ABORTED, RUNNING
from sagegate.sim.gateway_level import SimGateway

GATEWAY_POLICIES = [
    *sorted(n for n in names() if GATEWAY in parse_policy(n).levels),
    "admission-control:min_laxity_s=1.0",  # rejects (by default it never does)
    "kv-constrained:kv_threshold=0.3",  # holds often
]
CAPACITY_REQUESTS = 4


@dataclass(frozen=True)
class Arrive:
    prompt: int
    output: int
    prediction: LengthDistribution | None
    deadline_in: float | None
    priority: int
    tenant: str
    group: int | None = None
    """Prompts of one group share their first ``GROUP_TOKENS`` tokens (cache-aware placement)."""


@dataclass(frozen=True)
class Start:
    """The ``pick``-th dispatched request still waiting on its backend produces its first byte."""

    pick: int


@dataclass(frozen=True)
class Progress:
    """The ``pick``-th started request generated ``tokens`` more."""

    pick: int
    tokens: int


@dataclass(frozen=True)
class Finish:
    """The ``pick``-th dispatched request leaves its backend."""

    pick: int


@dataclass(frozen=True)
class Health:
    backend: int
    healthy: bool


Event = Arrive | Start | Progress | Finish | Health


@st.composite
def predictions(draw: st.DrawFn) -> LengthDistribution | None:
    if draw(st.booleans()):
        return None
    support = sorted(draw(st.sets(st.integers(1, 400), min_size=1, max_size=4)))
    weights = draw(st.lists(st.integers(1, 5), min_size=len(support), max_size=len(support)))
    return LengthDistribution(tuple(support), tuple(w / sum(weights) for w in weights))


arrivals = st.builds(
    Arrive,
    prompt=st.integers(1, 600),
    output=st.integers(1, 300),
    prediction=predictions(),
    deadline_in=st.none() | st.floats(0.0, 20.0),
    priority=st.integers(1, 3),
    tenant=st.sampled_from(["a", "b"]),
    group=st.none() | st.integers(0, 2),
)
GROUP_TOKENS = 320


def prompt_text(rid: int, event: Arrive) -> str:
    """``event.prompt`` tokens of text (4 characters a token): its group's shared head, then its own."""
    chars = 4 * event.prompt
    head = (
        ""
        if event.group is None
        else "".join(chr(65 + (event.group * 7 + i) % 26) for i in range(4 * GROUP_TOKENS))
    )
    own = f"<{rid}>" * chars
    return (head + own)[:chars]


events = st.one_of(
    arrivals,
    arrivals,
    arrivals,
    st.builds(Start, st.integers(0, 50)),
    st.builds(Progress, st.integers(0, 50), st.integers(1, 200)),
    st.builds(Finish, st.integers(0, 50)),
    st.builds(Health, st.integers(0, 3), st.booleans()),
)
admissions = st.builds(
    AdmissionConfig,
    quantile=st.sampled_from([0.3, 0.5, 0.9]),
    max_waiting=st.integers(1, 4),
    max_waiting_tokens=st.integers(50, 1500),
    rule=st.sampled_from(RULES),
    target=st.sampled_from([0.8, 1.5]),
    peak_target=st.sampled_from([0.7, 1.0]),
    band_reserve=st.sampled_from([0.0, 0.0, 0.3]),
)


@dataclass
class StandInEngine:
    """What the simulator's gateway reads of an engine: its waiting list (rid -> prompt) and running."""

    waiting: dict[int, int] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def waiting_tokens(self) -> int:
        return sum(self.waiting.values())

    @property
    def num_running(self) -> int:
        return len(self.running)

    prefix_hit_ratio = 0.0


def _seen(log: list[Decision[GatewayRequest]] | list[Decision[EngineRequest]]) -> list[tuple[object, ...]]:
    return [(d.kind, d.request.rid, d.backend, d.reason, _placed(d.placement), d.charge.value) for d in log]


def _placed(p: Placement | None) -> tuple[object, ...] | None:
    """A placement, its charge by value (each driver builds its own charge objects)."""
    if p is None:
        return None
    return (p.backend, p.cached_tokens, p.kind, None if p.charge is None else p.charge.value)


def _ledgers(loads: Sequence[BackendLoad]) -> list[tuple[float, int, int, bool]]:
    return [(ld.charged_tokens, ld.waiting, ld.waiting_tokens, ld.healthy) for ld in loads]


class PausingDispatcher(Dispatcher):
    """The live dispatcher with the accounting :meth:`Dispatcher.pause` owes (``policies.pause``):
    the upstream stream is cancelled by ``gateway.resume``, absent here; the request leaves its
    backend without finishing, keeps ``generated``, and waits in the queue again as a continuation."""

    def can_pause(self, req: GatewayRequest) -> bool:
        return True  # every started request is "streamed" here

    def pause_now(self, rid: object) -> PauseVerdict:
        req = next((r for r in self.flying.values() if r.rid == rid), None)
        if req is None:
            return PauseVerdict.UNKNOWN
        self.release(req, final=False)
        req.future = asyncio.get_running_loop().create_future()
        req.charge = None  # rebuilt at its progress
        self._charge(req)
        self.queue.push(req, self.clock())
        return PauseVerdict.PAUSED


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(GATEWAY_POLICIES),
    admissions,
    st.lists(st.integers(100, 2500), min_size=1, max_size=4),
    st.lists(st.tuples(events, st.floats(0.0, 2.0)), min_size=15, max_size=80),
    st.sampled_from(PLACEMENTS),
)
def test_gateway_and_simulator_decide_alike(
    policy_name: str,
    cfg: AdmissionConfig,
    capacities: list[int],
    script: list[tuple[Event, float]],
    placement: str,
) -> None:
    """Also where they place by the prefix cache each predicts (the same prompts, keyed each its own
    way: the gateway from text, the simulator by its engine's block keys)."""
    play(policy_name, cfg, capacities, script, None, placement)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["sagesched", "fcfs", "sagesched:buckets=4"]),
    admissions,
    st.lists(st.integers(100, 2500), min_size=1, max_size=4),
    st.lists(st.tuples(events, st.floats(0.0, 2.0)), min_size=15, max_size=80),
    st.sampled_from(PLACEMENTS),
)
def test_gateway_and_simulator_decide_alike_by_the_incumbent_rule(
    policy_name: str,
    cfg: AdmissionConfig,
    capacities: list[int],
    script: list[tuple[Event, float]],
    placement: str,
) -> None:
    """The cache-aware score rule (``picker: incumbent``) too, which the properties above no longer
    run since the default became the ``forecast`` (which reads the backends' running and waiting
    requests: both drivers count them alike, the gateway its own started requests)."""
    play(policy_name, cfg, capacities, script, None, placement, INCUMBENT_PROFILE)


pauses = st.builds(
    PauseConfig,
    enabled=st.just(True),
    max_pauses=st.integers(0, 3),
    hysteresis=st.sampled_from([0.0, 0.5, 2.0]),
    prefill_tokens_per_step=st.sampled_from([64.0, 512.0, 1e6]),
    bands=st.booleans(),
)


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(["sagesched", "gittins-length", "sagesched:buckets=4", "fcfs"]),
    admissions,
    st.lists(st.integers(100, 2500), min_size=1, max_size=4),
    st.lists(st.tuples(events, st.floats(0.0, 2.0)), min_size=15, max_size=80),
    pauses,
)
def test_gateway_and_simulator_pause_alike(
    policy_name: str,
    cfg: AdmissionConfig,
    capacities: list[int],
    script: list[tuple[Event, float]],
    pause: PauseConfig,
) -> None:
    """With pausing on, both drivers pause the same requests at the same decisions, and their ledgers
    agree after every event (a paused request's charge released, its continuation's rebuilt)."""
    play(policy_name, cfg, capacities, script, pause)


def test_the_pause_property_pauses() -> None:
    """The generated scripts do reach pauses (else the property above would test nothing)."""
    script: list[tuple[Event, float]] = [(Arrive(200, 300, None, None, 1, "a"), 0.1), (Start(0), 0.1)]
    script += [(Progress(0, 40), 0.1)]
    short = LengthDistribution((5,), (1.0,))
    script += [(Arrive(200, 5, short, None, 1, "a"), 0.1)]
    cfg = AdmissionConfig(max_waiting=4, max_waiting_tokens=1500)
    log = play("sagesched", cfg, [300], script, PauseConfig(enabled=True, hysteresis=0.0))
    seen = [(d.kind, d.request.rid) for d in log]
    # the long one runs; the short one fits nowhere, pauses it and goes; the continuation waits
    assert seen[:5] == [
        (DecisionKind.DISPATCH, 0),
        (DecisionKind.NO_ROOM, 3),
        (DecisionKind.PAUSE, 0),
        (DecisionKind.DISPATCH, 3),
        (DecisionKind.NO_ROOM, 0),
    ]
    assert log[2].request.pauses == 1 and log[2].request.generated == 40


def test_a_pause_is_judged_under_the_rule_the_head_is_placed_under() -> None:
    """Two band-0 requests fill the default band's 700 of 1,000 (``band_reserve`` 0.3); a band-1
    request needs 400. Pausing either one leaves 750 with it: room under the whole rule, none under the
    default band's. So nothing is paused (pausing both would be two pauses for one request)."""
    point = LengthDistribution((250,), (1.0,))
    script: list[tuple[Event, float]] = [
        (Arrive(100, 300, point, None, 0, "a"), 0.1),
        (Arrive(100, 300, point, None, 0, "a"), 0.1),
        (Start(0), 0.1),
        (Start(0), 0.1),
        (Arrive(150, 300, point, None, 1, "a"), 0.1),
    ]
    cfg = AdmissionConfig(rule="sum", target=1.0, band_reserve=0.3, max_waiting=4, max_waiting_tokens=1500)
    log = play("sagesched", cfg, [1000], script, PauseConfig(enabled=False, bands=True))
    kinds = [(d.kind, d.request.rid) for d in log]
    assert kinds[:2] == [(DecisionKind.DISPATCH, 0), (DecisionKind.DISPATCH, 1)]
    assert DecisionKind.PAUSE not in [k for k, _ in kinds] and kinds[-1][0] is DecisionKind.NO_ROOM


def play(
    policy_name: str,
    cfg: AdmissionConfig,
    capacities: list[int],
    script: list[tuple[Event, float]],
    pause: PauseConfig | None,
    placement: str = LEAST_LOADED,
    profile: PlacementProfile = DEFAULT_PROFILE,
) -> list[Decision[GatewayRequest]]:
    """Play ``script`` to both drivers, checking after every event; returns the gateway's decisions."""
    out: list[Decision[GatewayRequest]] = []

    async def go() -> None:
        clock = [0.0]
        n = len(capacities)
        # --- the live gateway's dispatcher, backends up with hand-set capacities (no probes) ---
        s = GatewaySettings.model_validate({"backends": [f"http://b{i}" for i in range(n)]})
        pool = BackendPool(s, httpx.AsyncClient())
        for b, cap in zip(pool.backends, capacities, strict=True):
            b.load.capacity_tokens = cap
            b.load.healthy = True
        gpolicy = parse_policy(policy_name)
        queue = BoundedQueue(gpolicy, 10**6, 10**12)
        locality = (
            Locality(PlacementSettings(block_tokens=16), pool.backends) if placement == CACHE_AWARE else None
        )
        d = PausingDispatcher(
            gpolicy,
            pool,
            cfg,
            queue,
            capacity_requests=CAPACITY_REQUESTS,
            pending_s=1e9,
            clock=lambda: clock[0],
            pause=pause,
            locality=locality,
            placement=profile,
        )
        glog = out
        d.dispatch_loop.log = glog
        greqs: dict[int, GatewayRequest] = {}
        # --- the simulator's gateway level, over stand-in engines ---
        engines = [StandInEngine() for _ in capacities]
        sreqs: dict[int, EngineRequest] = {}

        def send(req: EngineRequest, idx: int) -> None:
            req.backend = idx
            engines[idx].waiting[req.rid] = req.prompt_tokens

        def evict(req: EngineRequest) -> bool:
            engines[req.backend].running.discard(req.rid)
            req.state = ABORTED
            return True

        refused: dict[int, str] = {}
        sg = SimGateway(
            parse_policy(policy_name),
            cfg,
            capacities,
            capacity_requests=CAPACITY_REQUESTS * n,
            limits=None,
            send=send,
            refuse=lambda req, reason: refused.__setitem__(req.rid, reason),
            pause=pause,
            evict=evict,
            placement=placement,
            profile=profile,
            block_size=16,
        )
        slog: list[Decision[EngineRequest]] = []
        sg.dispatch_loop.log = slog

        for step, (event, dt) in enumerate(script):
            clock[0] += dt
            now = clock[0]
            g_before = len(glog)
            started = sorted(r for e in engines for r in e.running)
            unstarted = sorted(r for e in engines for r in e.waiting)
            if isinstance(event, Arrive):
                rid = step
                deadline = None if event.deadline_in is None else now + event.deadline_in
                who = {"tenant": event.tenant, "priority": event.priority}
                text = prompt_text(rid, event)
                g = GatewayRequest(rid, now, event.prompt, body={}, route="completions", model="m",
                                   prompt=text, deadline_s=deadline, prediction=event.prediction,
                                   **who)  # fmt: skip
                g.true_output = event.output
                greqs[rid] = g
                if locality is not None:
                    locality.describe(g, None)
                d.submit(g)
                sr = EngineRequest(rid, now, event.prompt, event.output, deadline_s=deadline, prompt=text,
                                   prediction=event.prediction, true_output=event.output, **who)  # fmt: skip
                sreqs[rid] = sr
                sg.enqueue(sr, now)
            elif isinstance(event, Start) and unstarted:
                rid = unstarted[event.pick % len(unstarted)]
                d.stop_waiting(greqs[rid])
                d.computed(greqs[rid])  # its first token: its prompt is cached there now
                sg.started(sreqs[rid])
                eng = engines[sreqs[rid].backend]
                del eng.waiting[rid]
                eng.running.add(rid)
                sreqs[rid].state = RUNNING
                sreqs[rid].t_first_token = now
            elif isinstance(event, Progress) and started:
                rid = started[event.pick % len(started)]
                g, sr = greqs[rid], sreqs[rid]
                d.progress(g, g.generated + event.tokens)
                sr.generated += event.tokens
                sg.progressed([sr])
                sg.policy.on_progress(sr, event.tokens, now)
            elif isinstance(event, Finish) and (started or unstarted):
                flying = sorted(started + unstarted)
                rid = flying[event.pick % len(flying)]
                d.computed(greqs[rid])  # (done: computed, if no first token was seen)
                d.release(greqs[rid])
                eng = engines[sreqs[rid].backend]
                eng.waiting.pop(rid, None)
                eng.running.discard(rid)
                sg.finish(sreqs[rid], now)
            elif isinstance(event, Health) and event.backend < n:
                pool.backends[event.backend].load.healthy = event.healthy
                sg.loads[event.backend].healthy = event.healthy
            # One pass per event on each side (the dispatcher passes at once on a static policy's
            # arrival; otherwise it would on the next loop iteration, which this test runs now).
            if len(glog) == g_before:
                d.dispatch()
            sg.dispatch(now, engines)

            assert _seen(glog) == _seen(slog), f"after event {step}: {event}"
            assert _ledgers(pool.loads) == _ledgers(sg.loads), f"after event {step}: {event}"
            batch = glog[g_before:]
            for j, dec in enumerate(batch):  # the waiting handler hears what the loop decided
                if dec.kind is DecisionKind.NO_ROOM and any(
                    later.request is dec.request for later in batch[j + 1 :]
                ):
                    continue  # a pause made its room: it is dispatched later in the same pass
                fut = dec.request.future
                assert fut is not None
                if dec.kind is DecisionKind.PAUSE:
                    assert dec.request.rid not in {r for e in engines for r in e.running}
                    continue
                if dec.kind is DecisionKind.DISPATCH:
                    assert fut.result() == dec.backend
                    assert sreqs[dec.request.rid].backend == dec.backend
                elif dec.kind in (DecisionKind.REJECT, DecisionKind.NO_HEALTHY_BACKEND):
                    exc = fut.exception()
                    assert isinstance(exc, DispatchRefused) and exc.reason == dec.reason
                    assert refused[dec.request.rid] == dec.reason
                else:
                    assert not fut.done()
            if glog[g_before:] and glog[-1].kind is DecisionKind.NO_HEALTHY_BACKEND:  # all refused
                assert len(queue) == len(sg.queue) == 0
            assert len(queue) == len(sg.queue)

    asyncio.run(go())
    return out
