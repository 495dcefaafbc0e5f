"""The decode cohort: running requests past their prefill, advanced together instead of one by one.

Near saturation a step's batch is mostly requests decoding one token each, and visiting every one of
them at every step (schedule it, grow its table, add its token) was most of the simulator's time. A
member of the cohort is not visited: its progress is an offset from the cohort's ``tick`` (decode
steps the cohort has taken), and only its exact due dates are kept, which never move while it
decodes:

* the tick it finishes at, ``joined + output_tokens − generated``;
* the ticks it needs a new KV block at, every ``block_size`` ticks from a fixed residue;
* its context, ``num_computed − joined``, summed over the cohort.

A member's fields (``generated``, ``num_computed``, ``table.nblocks``) are stale until
:meth:`DecodeCohort.sync` brings them to the tick; the engine syncs a member before anyone reads
it (it finishes, is aborted or paused), and dissolves the whole cohort for a step it cannot take
lazily (see :meth:`sim.engine.Engine.schedule`). Exact: the simulator's results are bit-identical
with and without it (``benchmarks.check_sim_exact``), which is why it is only used where nothing
reads a running request between steps (engine level, a policy with no progress hook, no re-keying
of running requests, no preemption for waiting ones; ``Engine(lazy_decode=True)``).

Invariants, for every member ``m``: ``m.cohort_tick ≥ 0`` (−1 outside the cohort); its table holds
exactly its computed tokens plus the ``pending`` steps of the step in flight, in blocks; it decodes
(``num_computed + 1 == prompt_tokens + generated``, ``generated ≥ 1``); and in the engine's running
list every member comes before every non-member (members join from the tail, and leave only).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sagegate.sim.engine_request import RUNNING, EngineRequest
from sagegate.sim.kv import BlockPool


class DecodeCohort:
    """Decoding requests advanced by a shared tick (see the module docstring)."""

    __slots__ = ("_bs", "_ctx", "_due", "_ends", "_finishing", "_rejoin", "pending", "size", "tick")

    def __init__(self, block_size: int) -> None:
        self._bs = block_size
        self.tick = 0
        """Decode steps the cohort has taken."""
        self.size = 0
        self.pending = 0
        """Decode steps of the step in flight whose blocks the members' tables already hold."""
        self._finishing: dict[int, list[EngineRequest]] = {}  # tick → members finishing then, joined order
        self._ends: list[int] = []  # a heap of ``_finishing``'s keys (stale ones skipped)
        self._due = [0] * block_size  # members by the residue (mod block_size) of their block ticks
        self._ctx = 0  # Σ (num_computed − cohort_tick): the context is this plus size × tick
        self._rejoin = False  # dissolved for the step in flight: every decoding request joins after it

    # --- membership ---------------------------------------------------------------------------
    def can_join(self, req: EngineRequest) -> bool:
        """Decoding, with a table that holds exactly its computed tokens (as growing step by step
        leaves it)."""
        c = req.num_computed
        return (
            req.generated > 0
            and c + 1 == req.prompt_tokens + req.generated
            and req.table.nblocks == -(-c // self._bs)
        )

    def join(self, req: EngineRequest) -> None:
        """``req``'s fields are exact and it :meth:`can_join`; it decodes with the cohort from now."""
        t = self.tick
        c = req.num_computed
        req.cohort_tick = t
        self.size += 1
        self._due[(t - c) % self._bs] += 1
        self._ctx += c - t
        end = t + req.output_tokens - req.generated
        members = self._finishing.get(end)
        if members is None:
            self._finishing[end] = [req]
            heapq.heappush(self._ends, end)
        else:
            members.append(req)

    def sync(self, req: EngineRequest) -> None:
        """Bring a member's fields to the tick (its due dates do not move)."""
        d = self.tick - req.cohort_tick
        if d:
            req.num_computed += d
            req.generated += d
            req.cohort_tick = self.tick
        req.table.nblocks = -(-(req.num_computed + self.pending) // self._bs)

    def leave(self, req: EngineRequest) -> None:
        """A member leaves (synced first): it is visited one by one again."""
        self.sync(req)
        t = self.tick
        c = req.num_computed
        self.size -= 1
        self._due[(t - c) % self._bs] -= 1
        self._ctx -= c - t
        end = t + req.output_tokens - req.generated
        members = self._finishing[end]
        members.remove(req)
        if not members:
            del self._finishing[end]  # its heap entry goes stale
        req.cohort_tick = -1

    def dissolve(self, running: Sequence[EngineRequest]) -> None:
        """Everyone leaves, synced (``running``: the engine's running list, whose head they are); they
        join again after the step (:meth:`take_in`)."""
        for req in running:  # all of it: a broken invariant must not sync a non-member
            if req.cohort_tick >= 0:
                self.sync(req)
                req.cohort_tick = -1
        self.size = 0
        self.pending = 0
        self._finishing.clear()
        self._ends.clear()
        self._due = [0] * self._bs
        self._ctx = 0
        self._rejoin = True

    def take_in(self, running: Sequence[EngineRequest], emitted: Sequence[EngineRequest]) -> None:
        """After a step: the requests it took past their prefill join (every decoding one after a
        dissolved step), in running order."""
        candidates = running if self._rejoin else emitted
        self._rejoin = False
        for req in candidates:
            if req.state is RUNNING and req.cohort_tick < 0 and self.can_join(req):
                self.join(req)

    def sync_all(self, running: Sequence[EngineRequest]) -> None:
        """Bring every member's fields to the tick (between steps), checking the invariants."""
        assert self.pending == 0, "between steps no block is held for a step in flight"
        for req in running[: self.size]:
            assert req.cohort_tick >= 0, "a non-member ahead of a decode cohort member"
            self.sync(req)

    # --- a step -------------------------------------------------------------------------------
    def start_step(self, running: Sequence[EngineRequest], budget: int, pool: BlockPool) -> int:
        """The scheduler's first move: how many members (the head of ``running``) decode a token
        this step, their blocks taken from ``pool``; 0 with no members, or when the step cannot be
        taken lazily (the cohort dissolves, and the scheduler visits everyone)."""
        self.pending = 0  # (a driver that dropped a step it scheduled holds no blocks for it)
        if not self.step_fits(running, budget, pool.free_blocks):
            self.dissolve(running)
            return 0
        if self.size:
            pool.take_fresh(self.due())
            self.pending = 1
        return self.size

    def step_fits(self, running: Sequence[EngineRequest], budget: int, free_blocks: int) -> bool:
        """Can the next step be taken lazily? The members lead the running list, each one's token fits
        the token ``budget``, and the blocks of everyone scheduled from the list fit ``free_blocks``
        (so no one is preempted). The engine's scheduling loop then visits only the tail."""
        n = self.size
        if budget < n:
            return False
        tail = running[n:]
        for req in tail:
            if req.cohort_tick >= 0:
                return False
        bs = self._bs
        need = self.due()
        budget -= n
        for req in tail:  # as the scheduling loop will, in order
            if budget <= 0:
                break
            c = req.num_computed
            todo = req.prompt_tokens + req.generated - c
            m = todo if todo < budget else budget
            grow = -(-(c + m) // bs) - req.table.nblocks
            if grow > 0:
                need += grow
            budget -= m
        return need <= free_blocks

    @property
    def context(self) -> int:
        """The members' computed tokens, summed (the KV their decode reads)."""
        return self._ctx + self.size * self.tick

    def due(self) -> int:
        """Blocks the members need for the next step."""
        return self._due[self.tick % self._bs]

    def blocks_for(self, steps: int) -> int:
        """Blocks the members need for the next ``steps`` steps, the first step's included."""
        t, bs = self.tick, self._bs
        total = 0
        for r, n in enumerate(self._due):
            if n:
                first = (r - t) % bs
                if first < steps:
                    total += n * ((steps - 1 - first) // bs + 1)
        return total

    def steps_left(self) -> int:
        """Steps until the first member finishes (at least 1 with members)."""
        ends, finishing = self._ends, self._finishing
        while ends[0] not in finishing:
            heapq.heappop(ends)
        return ends[0] - self.tick

    def end_step(self, k: int) -> list[EngineRequest]:
        """The step in flight ended: every member decoded ``k`` tokens. Returns, in running order,
        the members that produced their last token; they have left, synced."""
        self.pending = 0
        self.tick += k
        done = self._finishing.get(self.tick)
        if done is None:
            return []
        done = list(done)
        for req in done:
            self.leave(req)
        return done
