"""The admission ledger several gateway replicas share in Redis (``ledger.enabled``).

Each replica decides on its own event loop, without a round trip, on a *local view*: its own charges
(live) plus every other replica's (as of the last read, at most ``sync_interval_s`` old), so the
projected-peak rule weighs the whole fleet's load. That view is optimistic: two replicas may both see
the same room. So a dispatch is only *tentative* until Redis confirms it: :meth:`SharedLedger.commit`
queues the charge, one worker task sends every queued commit in one script call
(``gateway.ledger_script``: the admission rule evaluated inside Redis over every live replica's
charges, atomically), and the dispatcher hands the request to its backend only on a yes; on a no the
request goes back into the queue and the view is refreshed from the answer. Commits queued while a
call is in flight ride the next one (batching: one round trip per batch, not per decision).

Leases: every call renews this replica's lease (``lease_s``); the same call, every
``sync_interval_s``, republishes its charges' progress and reads the others'. A release is published
with the next call (the one carrying the next commit, at the latest the next sync), so a replica's
own freed room is in Redis before its next commit is checked. A charge that *grew* (its request ran
past its predicted length) is published within ``publish_s``: until it is, Redis would check
other replicas' commits against the smaller footprint (room granted twice, a preemption later). A
replica that dies stops renewing; within ``lease_s`` its charges drop out of every check and, one
sync later, out of every view. With ``order: threshold`` each sync also publishes this replica's
queue head and reads the others' (:attr:`SharedLedger.heads`, for ``policies.rank_threshold``).
Redis unreachable (a call fails or takes longer than ``timeout_s``): the replica keeps a local
ledger over ``local_share`` of each backend's capacity, accepts its queued commits itself, and
retries every sync; when Redis answers it republishes all its charges and rejoins.

Send first (``send_first_share`` > 0): the wait for Redis's yes holds the request's room idle for a
round trip, on a busy host tens of milliseconds. Within a budget per backend
(:meth:`SharedLedger.send_first`) a dispatch goes at once instead: its charge joins this replica's
own, rides the next call's publish, and that call reports whether the fleet's charges there then
exceed the rule's limit (``over``: counted, and the answer refreshes the view, so this replica sends
nothing more there until its view shows room). The budget is this replica's charges Redis has not
seen yet: at most ``send_first_share × capacity / live replicas`` per backend, so what every replica
can have granted on a stale view at once is at most ``send_first_share`` of the backend (with a fixed
set of replicas; joins widen it until the next call: docs/gateway.md, *Send first*).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sagegate.core.request import DEFAULT_PRIORITY
from sagegate.gateway.ledger_parts import LedgerMode, LedgerStats, QueueHead, RemoteCharge
from sagegate.gateway.ledger_script import LEDGER_LUA
from sagegate.gateway.settings import LedgerSettings
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.rank_threshold import ForeignHead, key_from_wire, wire_key

__all__ = ["LedgerMode", "LedgerStats", "QueueHead", "RemoteCharge", "SharedLedger", "Verdict"]

log = logging.getLogger("sagegate.gateway")

Verdict = Callable[[bool], None]
"""Called once with Redis's answer to a commit (True: charged; False: no room fleet-wide)."""


@dataclass(slots=True)
class _Commit:
    backend: int
    charge: Charge
    verdict: Verdict
    priority: int = DEFAULT_PRIORITY


class SharedLedger:
    """One replica's side of the shared ledger over the pool's ``loads`` (see the module docstring)."""

    def __init__(
        self,
        settings: LedgerSettings,
        redis_url: str,
        loads: Sequence[BackendLoad],
        backend_ids: Sequence[str],
        admission: AdmissionConfig,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.loads = loads
        self.backend_ids = list(backend_ids)
        """How replicas name a backend in Redis (its URL: the same fleet has the same URLs)."""
        self.admission = admission
        self.on_change = on_change
        self.clock = clock
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.mode = LedgerMode.SHARED
        self.stats = LedgerStats(remote_tokens=[0.0] * len(loads))
        self._own: list[dict[Charge, None]] = [{} for _ in loads]
        """This replica's charges Redis has accepted (or, alone, the local view did), by backend."""
        self._remote: list[list[RemoteCharge]] = [[] for _ in loads]
        self._commits: list[_Commit] = []
        self._dirty: set[int] = set()
        """Backends where one of ours left since the last publish."""
        self._freed = False
        """One of ours left since the last call: the next call announces it (``{prefix}:freed``)."""
        self._listener: asyncio.Task[None] | None = None
        self._true_capacity = [load.capacity_tokens for load in loads]
        self._set_capacity = list(self._true_capacity)
        self._next_sync = 0.0
        self._soon: asyncio.TimerHandle | None = None
        """Set while a call is due within ``publish_s`` (a growth, a release, another's release)."""
        self._last_read = 0.0
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._redis: Any = None
        self._script: Any = None
        self.pending_of: Callable[[int], tuple[int, int]] = lambda backend: (0, 0)
        """This replica's requests sent to a backend since its last scrape (count, prompt tokens):
        published with every call, so the other replicas count them as waiting there."""
        self.head_of: Callable[[], QueueHead | None] = lambda: None
        """This replica's queue head now (the dispatcher sets it; published every sync)."""
        self.heads: list[ForeignHead] = []
        """The other replicas' published heads as of the last sync (``order: threshold``)."""
        self.threshold = settings.order == "threshold"
        self.members = 1
        """Live replicas as of the last call (this one included): the send-first budget's divisor."""
        self._unseen = [0.0] * len(loads)
        """Per backend, the footprint of this replica's sends Redis has not seen yet (send first)."""
        self._check: set[int] = set()
        """Backends where this replica sent first since the last call: the next call checks them."""
        self.on_over: Callable[[str], None] = lambda backend: None
        """Called with a backend's name when a check finds it over the limit (a metric)."""

    # --- life ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join (one round: lease, publish, read), then the worker task."""
        import redis.asyncio as aioredis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        t = self.settings.timeout_s
        self._redis = aioredis.Redis.from_url(
            self.redis_url, socket_timeout=t, socket_connect_timeout=t, retry=Retry(NoBackoff(), 0)
        )
        self._script = self._redis.register_script(LEDGER_LUA)
        await self._round()
        self._task = asyncio.create_task(self._run(), name="ledger-sync")
        self._listener = asyncio.create_task(self._listen(), name="ledger-freed")

    async def stop(self) -> None:
        """Stop syncing and leave: this replica's charges and lease are deleted at once (best
        effort), so the others need not wait out the lease."""
        self._stopping = True  # (a cancellation that asyncio.wait_for swallows still ends the loop)
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        for task in (self._task, self._listener):
            if task is not None:
                task.cancel()
                await asyncio.wait({task}, timeout=2 * self.settings.timeout_s + 1)
        self._task = self._listener = None
        if self._redis is None:
            return
        p = self.settings.prefix
        with contextlib.suppress(Exception):
            keys = [f"{p}:c:{self.replica}:{b}" for b in self.backend_ids] + [f"{p}:h:{self.replica}"]
            await self._redis.delete(*keys)
            await self._redis.zrem(f"{p}:members", self.replica)
        with contextlib.suppress(Exception):
            await self._redis.aclose()

    # --- the dispatcher's hooks ----------------------------------------------------------------
    def prepare(self) -> None:
        """Before a dispatch pass: each backend's capacity as this replica may use it (all of it when
        shared, ``local_share`` of it alone). A scrape that set a new capacity is taken as the truth."""
        share = self.settings.local_share if self.mode is LedgerMode.LOCAL else 1.0
        for i, load in enumerate(self.loads):
            if load.capacity_tokens != self._set_capacity[i]:
                self._true_capacity[i] = load.capacity_tokens
            want = max(1, int(share * self._true_capacity[i]))
            load.capacity_tokens = self._set_capacity[i] = want

    def commit(
        self, backend: int, charge: Charge, verdict: Verdict, *, priority: int = DEFAULT_PRIORITY
    ) -> None:
        """Ask Redis to charge ``charge`` on ``backend`` (the local view already admitted it) under
        the rule for ``priority``'s band; ``verdict`` gets the answer. Alone (Redis down) the local
        view's yes is the answer, at once."""
        if self.mode is LedgerMode.LOCAL:
            self._own[backend][charge] = None
            verdict(True)
            return
        self._commits.append(_Commit(backend, charge, verdict, priority))
        # Our charges there as they stand ride the same call: Redis checks the commit against the
        # charges the local decision weighed, not against the last sync's.
        self._dirty.add(backend)
        self._wake.set()

    def send_first(self, backend: int, charge: Charge) -> bool:
        """Whether ``charge``, which the local view admitted on ``backend``, may be sent at once and
        published after (see the module docstring). True: it is this replica's charge now, and the
        next call (soon) publishes and checks it; False: :meth:`commit` it and wait for the answer."""
        share = self.settings.send_first_share
        if share <= 0.0 or self.mode is not LedgerMode.SHARED:
            return False
        size = charge.held + charge.remaining
        budget = share * self._true_capacity[backend] / max(1, self.members)
        if self._unseen[backend] + size > budget:
            return False
        self._unseen[backend] += size
        self._own[backend][charge] = None
        self._dirty.add(backend)
        self._check.add(backend)
        self.stats.sent_first += 1
        self._wake.set()
        return True

    def released(self, charge: Charge, backend: int) -> None:
        """One of this replica's charges left ``backend``."""
        own = self._own[backend]
        if charge in own:
            del own[charge]
            self._dirty.add(backend)
            if self.mode is LedgerMode.SHARED and self.heads:  # another replica waits for room:
                self._freed = True  # publish soon, and announce it
                self._call_soon(self.settings.publish_s)

    def changed(self, charge: Charge, backend: int) -> None:
        """One of this replica's charges on ``backend`` grew (or was charged by a late prediction):
        publish it within ``publish_s`` (changed charges coalesce into one call)."""
        if charge not in self._own[backend] or self.mode is LedgerMode.LOCAL:
            return
        self._dirty.add(backend)
        self._call_soon(self.settings.publish_s)

    def _call_soon(self, delay: float) -> None:
        """A round within ``delay`` seconds (coalesced: one pending at a time, the earliest kept)."""
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_later(max(0.0, delay), self._wake.set)

    # --- the worker ----------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            alarm = loop.call_later(self.settings.sync_interval_s, self._wake.set)
            try:
                await self._wake.wait()  # a commit, or the next sync
            finally:
                alarm.cancel()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self._round()
            except Exception:  # the worker must never die: the next round tries again
                log.exception("ledger: round failed unexpectedly")

    async def _round(self) -> None:
        """One script call: commits and releases queued since the last, and a sync if one is due."""
        now = self.clock()
        sync = now >= self._next_sync or self.mode is LedgerMode.LOCAL
        commits, self._commits = self._commits, []
        publish = range(len(self.loads)) if sync else sorted(self._dirty)
        self._dirty = set()
        check, self._check = self._check, set()
        unseen = list(self._unseen)  # what this call shows Redis (sends during the call ride the next)
        if self._soon is not None:  # what was due rides this call
            self._soon.cancel()
            self._soon = None
        payload = {
            "replica": self.replica,
            "lease_ms": int(self.settings.lease_s * 1000),
            "prefix": self.settings.prefix,
            "backends": self.backend_ids,
            "publish": {self.backend_ids[b]: self._packed(b) for b in publish},
            "commit": [self._commit_args(c) for c in commits],
            "read": sync,
            "freed": self._freed,
            "pending": {name: "{}:{}".format(*self.pending_of(b)) for b, name in enumerate(self.backend_ids)},
        }
        if check:
            payload["check"] = {
                self.backend_ids[b]: [*self._limit(b), self.loads[b].resident.pinned_tokens] for b in check
            }
        self._freed = False
        if sync and self.threshold:
            head = self.head_of()
            payload["head"] = (
                []
                if head is None
                else [wire_key(head.key), head.charge.held, head.charge.remaining, head.prompt_tokens]
            )
        t0 = time.perf_counter()
        try:
            raw = await asyncio.wait_for(self._script(args=[json.dumps(payload)]), self.settings.timeout_s)
        except Exception as exc:  # unreachable, timed out, or refused: alone until it answers
            self._alone(exc, commits)
            return
        finally:
            self.stats.last_call_s = time.perf_counter() - t0
            self._unseen = [max(0.0, u - seen) for u, seen in zip(self._unseen, unseen, strict=True)]
        self.stats.calls += 1
        self.stats.batch_max = max(self.stats.batch_max, len(commits))
        if self.mode is LedgerMode.LOCAL and sync:
            self.mode = LedgerMode.SHARED
            self.stats.rejoins += 1
            log.warning("ledger: Redis answers again; replica %s rejoined the shared ledger", self.replica)
        answer = json.loads(raw)
        oks = answer.get("ok") or []
        if isinstance(oks, dict):  # cjson writes an empty table as {}
            oks = []
        denied = False
        for c, ok in zip(commits, oks, strict=True):
            self.stats.commits += 1
            if ok:
                self._own[c.backend][c.charge] = None
            else:
                self.stats.denied += 1
                denied = True
            c.verdict(bool(ok))
        self.members = int(answer.get("members") or 1)
        over = answer.get("over") or []
        if isinstance(over, list) and over:
            self.stats.over += len(over)
            denied = True  # the answer carries the fleet's charges: the view shows no room there now
            for name in over:
                self.on_over(str(name))
        if sync:
            self._next_sync = now + self.settings.sync_interval_s
            self._last_read = now
        if denied:  # the next call republishes our progress first, so Redis and our view agree
            self._next_sync = 0.0
        if sync and self.threshold:
            self.heads = [
                ForeignHead(key_from_wire(k), RemoteCharge(int(h), int(r)), int(p))
                for k, h, r, p in (answer.get("heads") or [])
            ]
        if sync or denied:
            self._view(answer.get("others") or {}, answer.get("pending") or {})

    async def _listen(self) -> None:
        """Another replica released a charge (``{prefix}:freed``): if this one has a queued head,
        read the ledger now, not at the next sync, so room freed elsewhere is seen within a round
        trip. A release is announced only while another replica's queue head is known (``order:
        threshold``): where no replica waits, nobody pays for the news. Best effort: while the
        channel is down, the syncs still bring it."""
        while not self._stopping:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(f"{self.settings.prefix}:freed")
                while not self._stopping:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    sender = msg.get("data")
                    mine = (sender.decode() if isinstance(sender, bytes) else sender) == self.replica
                    if not mine and self.head_of() is not None:  # only a replica that waits reads
                        self._next_sync = 0.0  # the next round reads, at most one per publish_s
                        self._call_soon(self._last_read + self.settings.publish_s - self.clock())
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: the next attempt after a sync's wait
                await asyncio.sleep(self.settings.sync_interval_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _commit_args(self, c: _Commit) -> list[str | int | float]:
        """``[backend, held, remaining, limit, rule, pinned]``: ``pinned``, the prompt blocks this
        replica's view charges to the backend itself (``policies.resident``), as its local rule does."""
        limit, rule = self._limit(c.backend, c.priority)
        pinned = self.loads[c.backend].resident.pinned_tokens
        return [self.backend_ids[c.backend], c.charge.held, c.charge.remaining, limit, rule, pinned]

    def _limit(self, backend: int, priority: int | None = None) -> tuple[float, str]:
        """The rule's limit on ``backend``'s true capacity for a request of ``priority`` (None: the
        whole rule, no band reserve), and the rule."""
        cfg = self.admission if priority is None else self.admission.for_band(priority)
        cap = self._true_capacity[backend]
        return (cfg.target * cap if cfg.rule == "sum" else cfg.peak_target * cap), cfg.rule

    def _packed(self, backend: int) -> str:
        """Our charges on ``backend`` as they stand now (``"held:remaining,"`` each), replacing what
        Redis holds for us there."""
        return "".join([f"{c.held}:{c.remaining}," for c in self._own[backend]])

    def _view(self, others: dict[str, str], pending: dict[str, str]) -> None:
        """Replace the other replicas' charges and unscraped sends (``"n:tokens"`` per backend) in
        the local view with what Redis just said."""
        for i, load in enumerate(self.loads):
            n, _, t = pending.get(self.backend_ids[i], "0:0").partition(":")
            load.foreign_waiting, load.foreign_waiting_tokens = int(n), int(t or 0)
            for old in self._remote[i]:
                load.release(old)
            fresh = [
                RemoteCharge(int(h), int(r))
                for h, _, r in (p.partition(":") for p in others.get(self.backend_ids[i], "").split(",") if p)
            ]
            for c in fresh:
                load.charge(c)
            self._remote[i] = fresh
            self.stats.remote_tokens[i] = sum(c.value for c in fresh)
        self.on_change()

    def _alone(self, exc: Exception, commits: list[_Commit]) -> None:
        """Redis failed: local ledgers over ``local_share``; the queued commits stand as decided."""
        self.stats.failures += 1
        commits, self._commits = commits + self._commits, []
        if self.mode is LedgerMode.SHARED:
            log.warning(
                "ledger: Redis unavailable (%s); admitting into %.0f%% of each backend alone",
                exc or type(exc).__name__,
                100 * self.settings.local_share,
            )
            self.mode = LedgerMode.LOCAL
            self.heads = []
            self._view({}, {})  # alone: only what this replica's own scrapes see
        for c in commits:
            self._own[c.backend][c.charge] = None
            c.verdict(True)
        self._dirty.clear()  # the rejoin republishes everything

    def snapshot(self) -> dict[str, Any]:
        """What ``/admin/ledger`` shows."""
        s = self.stats
        return {
            "replica": self.replica,
            "mode": str(self.mode),
            "order": self.settings.order,
            "foreign_heads": len(self.heads),
            "local_share": self.settings.local_share,
            "own_charges": sum(len(own) for own in self._own),
            "pending_commits": len(self._commits),
            "calls": s.calls,
            "commits": s.commits,
            "denied": s.denied,
            "failures": s.failures,
            "rejoins": s.rejoins,
            "batch_max": s.batch_max,
            "sent_first": s.sent_first,
            "over": s.over,
            "members": self.members,
            "last_call_ms": round(1000 * s.last_call_s, 3),
            "remote_tokens": dict(zip(self.backend_ids, s.remote_tokens, strict=True)),
        }
