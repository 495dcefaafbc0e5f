"""Several gateway replicas in front of one fleet, in the simulator (one order).

A balancer splits one trace over ``replicas`` gateways (round robin or at random, as an L4 balancer
does). Each replica is the simulator's own gateway level (``sim.gateway_level.SimGateway`` and the
live dispatch pass it drives, composed here, not changed) over ONE shared admission ledger: the
``BackendLoad`` objects are the fleet's, so the Redis ledger is modelled as exact and instant (what
``gateway.ledger`` approximates with a 50 ms view and an atomic check-and-charge). How the replicas
agree on an order is :attr:`ReplicaSetup.order`:

* ``none`` — today's live behaviour: each replica dispatches its own head whenever the shared ledger
  admits it. A dispatch reaches its backend one commit round trip (``rtt_s``) later; commits made
  while a call is in flight ride the next call (``gateway.ledger`` batches them so).
* ``threshold`` — as ``none``, and every ``publish_s`` (the ledger sync it would ride on) a replica
  publishes its queue head (rank key and charge) and reads the others'. It holds a head ranked worse
  than a foreign published head when dispatching it would leave that head no backend that admits it
  (capacity is scarce); with room for both, it goes (``policies.rank_threshold``, the live
  dispatcher's own check). The published heads may be stale.
* ``global`` — one queue over every replica's waiting work (a Redis sorted set ranked by the policy's
  key, popped by a check-and-charge script): one ranking, but a decision is a round trip, so the
  ``j``-th dispatch of a pass (from 1) reaches its backend ``j · rtt_s`` later.

``send_first_share`` (``none`` and ``threshold``; ``gateway.ledger``'s ``send_first_share``): a
dispatch whose footprint fits the replica's send-first budget on that backend (its sends not yet
carried by a finished commit call, at most ``share × capacity / replicas``) reaches its backend at
once; its charge rides the next call as a commit would. The ledger being exact here, no room is
granted twice: this measures what the wait costs, not the over-admission it risks.

When a replica runs a pass is :attr:`ReplicaSetup.wake`: ``own`` (as live) at its own arrivals, at
the steps where its own requests progressed or finished (it streams them), and at its ledger sync
every ``publish_s`` (where it learns of the others' releases); ``any``: every replica at every
event. Woken replicas pass in a random order per event (which takes freed room first is a race).
Under ``global`` any replica that sees an event pops the one queue. ``replicas=1, order="none",
rtt_s=0`` is the ordinary gateway level.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from sagegate.core.request import TraceRequest
from sagegate.policies.admission import AdmissionConfig, BackendLoad
from sagegate.policies.base import GATEWAY, Policy
from sagegate.policies.queue import PolicyQueue
from sagegate.policies.rank_threshold import ForeignHead, threshold_mask
from sagegate.sim.des import SimResult, SimSetup, Simulation
from sagegate.sim.engine import Engine, EngineRequest
from sagegate.sim.gateway_level import EngineBacklog, QueueLimits, Refuse, SimGateway

Order = Literal["none", "threshold", "global"]
ORDERS: tuple[str, ...] = get_args(Order)
Split = Literal["round-robin", "random", "prompt"]
SPLITS: tuple[str, ...] = get_args(Split)
Wake = Literal["own", "any"]
WAKES: tuple[str, ...] = get_args(Wake)


@dataclass(frozen=True)
class ReplicaSetup:
    replicas: int = 2
    order: Order = "none"
    split: Split = "round-robin"
    rtt_s: float = 0.0005
    """A Redis round trip: per commit call (``none``, ``threshold``) or per decision (``global``)."""
    publish_s: float = 0.05
    """The ledger sync: how often a replica reads the others' charges (and is woken by them) and,
    under ``threshold``, publishes its head and reads the others'."""
    wake: Wake = "own"
    seed: int = 0
    send_first_share: float = 0.0
    """Send first within a budget (see the module docstring); 0: every dispatch waits its round trip."""
    prompt_edges: tuple[int, ...] = ()
    """Split ``prompt``: replica ``k`` takes the prompts between edge ``k-1`` and edge ``k`` (a
    balancer's affinity, e.g. one client's long documents on one connection; ``replicas - 1`` edges)."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {self.order!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        if self.wake not in WAKES:
            raise ValueError(f"wake must be one of {', '.join(WAKES)}, not {self.wake!r}")
        if self.split == "prompt" and len(self.prompt_edges) != self.replicas - 1:
            raise ValueError("split 'prompt' needs replicas - 1 prompt_edges")
        if self.rtt_s < 0 or self.publish_s <= 0:
            raise ValueError("rtt_s must be >= 0 and publish_s > 0")
        if not 0.0 <= self.send_first_share < 1.0:
            raise ValueError("send_first_share must be in [0, 1)")


@dataclass
class FleetStats:
    inversions: int = 0
    """Dispatches made while a better-ranked request waited in another replica's queue."""
    holds: int = 0
    """Threshold decisions that held a head for a foreign one (every backend masked)."""
    delay_s: float = 0.0
    """Sum over dispatches of the time from decision to backend (round trips)."""
    dispatches: int = 0
    sent_first: int = 0
    """Dispatches that went at once within the send-first budget."""


class _Backlog:
    """An engine's waiting list as a pass sees it: plus the requests on their way there."""

    __slots__ = ("engine", "transit", "transit_tokens")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.transit = 0
        self.transit_tokens = 0

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + self.transit

    @property
    def waiting_tokens(self) -> int:
        return self.engine.waiting_tokens + self.transit_tokens

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def prefix_hit_ratio(self) -> float:
        return self.engine.prefix_hit_ratio


class ReplicaGateway(SimGateway):
    """One replica: a :class:`SimGateway` over the fleet's shared ledger, whose ``allowed`` hook
    applies the shared rank threshold (``view``: the other replicas' heads as of its last sync)."""

    def __init__(self, fleet: ReplicaFleet, policy: Policy, admission: AdmissionConfig, **kw: Any) -> None:
        super().__init__(policy, admission, [ld.capacity_tokens for ld in fleet.loads], **kw)
        self.loads = fleet.loads
        self.fleet = fleet
        self.view: list[ForeignHead] = []

    def allowed(self, req: EngineRequest) -> Sequence[bool] | None:
        if not self.view:
            return None
        mask = threshold_mask(
            req.key_cache, self.charge(req), req.prompt_tokens, self.loads, self.admission, self.view
        )
        if mask is not None and not any(mask):
            self.fleet.stats.holds += 1
        return mask


class _Queues:
    """Every replica's queue, as the simulation counts it (``len``)."""

    def __init__(self, gateways: Sequence[SimGateway]) -> None:
        self.gateways = gateways

    def __len__(self) -> int:
        return sum(len(g.queue) for g in self.gateways)

    def __bool__(self) -> bool:
        return any(len(g.queue) for g in self.gateways)


class ReplicaFleet:
    """The replicas and their shared ledger; to the simulation it is the gateway level (it answers
    the calls ``Simulation`` makes of a ``SimGateway``)."""

    def __init__(
        self,
        sim: ReplicaSimulation,
        setup: ReplicaSetup,
        policy: Policy,
        admission: AdmissionConfig,
        *,
        capacity_requests: int,
        limits: QueueLimits | None,
        refuse: Refuse,
    ) -> None:
        self.sim = sim
        self.setup = setup
        self.loads = [BackendLoad(e.capacity_tokens) for e in sim.engines]
        self.backlogs = [_Backlog(e) for e in sim.engines]
        self.stats = FleetStats()
        queues = 1 if setup.order == "global" else setup.replicas
        self.gateways = [
            ReplicaGateway(
                self,
                policy,
                admission,
                capacity_requests=capacity_requests,
                limits=limits,
                send=self._sender(r),
                refuse=refuse,
            )
            for r in range(queues)
        ]
        self.queue = _Queues(self.gateways)
        self.owner: dict[EngineRequest, int] = {}
        self.rng = random.Random(setup.seed)
        self.rr = 0
        self.pass_order = list(range(queues))
        n, p = len(self.gateways), setup.publish_s
        self.next_sync = [r * p / n for r in range(n)]
        self.board: list[ForeignHead | None] = [None] * n
        self.call = [(-1.0, -1.0)] * n  # each replica's ledger call: (start, end)
        self.decided_at, self.in_pass = -1.0, 0  # global: decisions so far in the pass at ``decided_at``
        self.unseen: list[list[list[tuple[float, float]]]] = [[[] for _ in self.loads] for _ in range(n)]
        """Per replica and backend, its sends first not yet carried by a finished call: (end, size)."""
        self.woken: set[int] = set()

    # --- what the simulation calls --------------------------------------------------------------
    def full_reason(self, req: EngineRequest) -> str | None:
        return self.gateways[self._route(req)].full_reason(req)

    def enqueue(self, req: EngineRequest, now: float) -> None:
        r = self.owner[req]
        self.woken.add(r)
        self.gateways[r].enqueue(req, now)

    def dispatch(self, now: float, engines: Sequence[EngineBacklog]) -> None:
        self._sync(now)
        if len(self.gateways) == 1:
            self.woken.clear()
            self.gateways[0].dispatch(now, self.backlogs)
            return
        if self.setup.wake == "any":
            order = self.pass_order
        else:
            order, self.woken = sorted(self.woken), set()
        if len(order) > 1:
            self.rng.shuffle(order)
        for r in order:
            self.gateways[r].dispatch(now, self.backlogs)

    def progressed(self, emitted: Sequence[EngineRequest]) -> None:
        if len(self.gateways) == 1:
            self.gateways[0].progressed(emitted)
            return
        by: dict[int, list[EngineRequest]] = {}
        for req in emitted:
            by.setdefault(self.owner[req], []).append(req)
        for r, reqs in by.items():
            self.woken.add(r)
            self.gateways[r].progressed(reqs)

    def started(self, req: EngineRequest) -> None:
        self.gateways[self.owner[req]].started(req)

    def finish(self, req: EngineRequest, now: float) -> None:
        r = self.owner.pop(req)
        self.woken.add(r)
        self.gateways[r].finish(req, now)

    # --- inside -----------------------------------------------------------------------------------
    def _route(self, req: EngineRequest) -> int:
        """The balancer's choice of replica (one queue for all under ``global``)."""
        r = self.owner.get(req)
        if r is None:
            n = self.setup.replicas
            if self.setup.split == "random":
                pick = self.rng.randrange(n)
            elif self.setup.split == "prompt":
                pick = bisect_right(self.setup.prompt_edges, req.prompt_tokens)
            else:
                pick, self.rr = self.rr, (self.rr + 1) % n
            r = self.owner[req] = 0 if self.setup.order == "global" else pick
        return r

    def _sync(self, now: float) -> None:
        """Replicas whose sync is due are woken and (``threshold``) publish their head and read the
        others' (lazily, at the first event after it is due)."""
        p, threshold = self.setup.publish_s, self.setup.order == "threshold"
        for r, g in enumerate(self.gateways):
            due = self.next_sync[r]
            if now < due:
                continue
            self.next_sync[r] = due + p * (math.floor((now - due) / p) + 1)
            self.woken.add(r)
            if not threshold:
                continue
            head = g.queue.peek(now)
            self.board[r] = (
                None if head is None else ForeignHead(head.key_cache, g.charge(head), head.prompt_tokens)
            )
            g.view = [h for q, h in enumerate(self.board) if q != r and h is not None]

    def _sender(self, r: int) -> Any:
        return lambda req, backend: self._send(r, req, backend)

    def _send(self, r: int, req: EngineRequest, backend: int) -> None:
        """Replica ``r`` decided to dispatch ``req`` to ``backend``: it gets there after the round
        trip(s) its order needs."""
        sim, setup, now = self.sim, self.setup, self.sim.now
        self._count_inversion(r, req, now)
        rtt = setup.rtt_s
        if rtt <= 0:
            sim.deliver_now(req, backend)
            return
        if setup.order == "global":  # a pass's decisions are round trips one after the other
            if now != self.decided_at:
                self.decided_at, self.in_pass = now, 0
            self.in_pass += 1
            at = now + self.in_pass * rtt
        else:  # one commit call at a time; commits made meanwhile ride the next one
            start, end = self.call[r]
            if now >= end:
                start, end = now, now + rtt
            elif now > start:
                start, end = end, end + rtt
            self.call[r] = (start, end)
            at = end
            if self._send_first(r, req, backend, end, now):
                sim.deliver_now(req, backend)
                return
        self.stats.delay_s += at - now
        b = self.backlogs[backend]
        b.transit += 1
        b.transit_tokens += req.prompt_tokens
        sim.deliver_at(at, req, backend)

    def _send_first(self, r: int, req: EngineRequest, backend: int, seen_at: float, now: float) -> bool:
        """Whether ``req`` fits replica ``r``'s send-first budget on ``backend`` (and if so, count it
        unseen until the call carrying it ends at ``seen_at``)."""
        share = self.setup.send_first_share
        if share <= 0.0:
            return False
        unseen = self.unseen[r][backend] = [(t, c) for t, c in self.unseen[r][backend] if t > now]
        charge = self.gateways[r].charge(req)
        size = charge.held + charge.remaining
        budget = share * self.loads[backend].capacity_tokens / self.setup.replicas
        if sum(c for _, c in unseen) + size > budget:
            return False
        unseen.append((seen_at, size))
        self.stats.sent_first += 1
        return True

    def delivered(self, req: EngineRequest, backend: int) -> None:
        b = self.backlogs[backend]
        b.transit -= 1
        b.transit_tokens -= req.prompt_tokens

    def _count_inversion(self, r: int, req: EngineRequest, now: float) -> None:
        self.stats.dispatches += 1
        key = req.key_cache
        for q, g in enumerate(self.gateways):
            if q != r and g.queue:
                other = g.queue.peek(now)
                if other is not None and other.key_cache < key:
                    self.stats.inversions += 1
                    return


class ReplicaSimulation(Simulation):
    """A gateway-level :class:`~sim.des.Simulation` whose gateway is a :class:`ReplicaFleet`, with
    timer events for dispatches on their way to a backend."""

    def __init__(self, workload: Sequence[TraceRequest], setup: SimSetup, replicas: ReplicaSetup) -> None:
        if setup.level != GATEWAY:
            raise ValueError("replicas are gateways: level must be 'gateway'")
        super().__init__(workload, setup)
        self.timer = len(self.engines)
        self.pending: list[tuple[float, int, EngineRequest, int]] = []
        self.fleet = ReplicaFleet(
            self,
            replicas,
            setup.policy,
            setup.admission,
            capacity_requests=setup.engine.max_num_seqs * setup.engines,
            limits=setup.queue_limits,
            refuse=self._reject,
        )
        # Duck-typed: Simulation calls only full_reason, enqueue, dispatch, progressed and finish on
        # its gateway, and len()/bool() on its queue.
        self.gw = cast(SimGateway, self.fleet)
        self.queue = cast(PolicyQueue[EngineRequest], self.fleet.queue)

    def deliver_now(self, req: EngineRequest, backend: int) -> None:
        self._send(req, backend)

    def deliver_at(self, at: float, req: EngineRequest, backend: int) -> None:
        self.seq += 1
        heapq.heappush(self.pending, (at, self.seq, req, backend))
        heapq.heappush(self.events, (at, self.seq, self.timer))

    def _step_end(self, idx: int) -> None:
        if idx != self.timer:
            super()._step_end(idx)
            return
        pending = self.pending
        while pending and pending[0][0] <= self.now:
            _, _, req, backend = heapq.heappop(pending)
            self.fleet.delivered(req, backend)
            self._send(req, backend)

    def _fold_horizon(self) -> float:
        """``Simulation._fold_horizon``, a folded decode run also ending at the next delivery."""
        horizon = super()._fold_horizon()
        return min(horizon, self.pending[0][0]) if self.pending else horizon


def simulate_replicas(
    workload: Sequence[TraceRequest], setup: SimSetup, replicas: ReplicaSetup
) -> tuple[SimResult, FleetStats]:
    """Run ``workload`` through ``replicas`` gateways in front of ``setup``'s engines."""
    sim = ReplicaSimulation(workload, setup, replicas)
    return sim.run(), sim.fleet.stats
