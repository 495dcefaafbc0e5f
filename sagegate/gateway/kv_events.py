"""Precise cache-aware placement: following each backend's KV-cache events, as vLLM publishes them.

For a backend configured with ``kv_events`` (an endpoint beside its URL), a :class:`KVEventFollower`
subscribes to the engine's ZMQ PUB socket and keeps a ``gateway.kv_index.ExactIndex`` of what it
caches. ``gateway.locality`` asks it, for a precise backend, how many of a request's prompt tokens
are cached there, from the request's token ids (``gateway.tokens``, computed once at enqueue and only
while some backend is precise); any other backend answers from the approximate index, which is kept
for every backend all along so that falling back costs nothing.

A backend is *precise* while its events are known to be whole: from the first message of a publisher
that started at sequence 0 (or whose missed history the replay socket gave back), until a sequence gap
that replay cannot fill, a malformed message, a broken subscription, or ``stale_s`` after a request was
sent there with no event since (its events stopped). After a gap the exact index is cleared and rebuilt
from what follows, the approximate index placing for ``resync_s`` meanwhile (or until the engine reports its
cache cleared). A backend that goes down or restarts (``gateway.backends``) forgets both indexes; a
publisher whose sequence starts again from 0 restarted, and its cache with it.

Bounded work: a message longer than ``max_message_bytes`` is refused by ZMQ (``MAXMSGSIZE``), at most
``receive_hwm`` wait unread (more are lost: a gap), the loop is yielded after every message, and the
index holds at most the backend's capacity in blocks.

A subscription never stays deaf: ZMQ answers a message over ``MAXMSGSIZE`` by closing the connection
and, for that protocol error, never reconnects. The follower watches its socket's own events, and on a
disconnection (that, or a publisher that went away) it counts ``dropped{why="connection"}``, logs (at
most once a minute), reports the backend ``disconnected`` and opens a new socket at once; the next
batch's sequence number says what was missed (a gap: replayed, or the index rebuilt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sagegate.gateway.kv_index import Cleared, ExactIndex, Malformed, Removed, decode_batch
from sagegate.gateway.metrics import RateLimitedLog
from sagegate.gateway.settings_kv_events import BackendKVEvents, KVEventsSettings

if TYPE_CHECKING:
    from sagegate.gateway.backends import Backend

log = logging.getLogger("sagegate.gateway")

STATES = ("waiting", "precise", "resync", "stale", "disconnected")
"""``waiting``: no message yet (or since the backend went down); ``resync``: rebuilding after a gap;
``stale``: requests sent, no event since ``stale_s``; ``disconnected``: the subscription broke, and no
message has come on the new one yet (what was missed is not known)."""
HEARTBEAT_MS = 2_000
"""ZMTP heartbeats on the subscription: a publisher whose host vanished (no TCP reset) is noticed
within ``3 * HEARTBEAT_MS`` as a disconnection."""
END_SEQ = -1
REPLAY_MAX_BYTES = 64 << 20
"""A gap whose batches weigh more is not replayed (the index is rebuilt instead): bounded memory."""


@dataclass
class Counts:
    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    gaps: int = 0
    replayed: int = 0
    """Gaps (or missed history) the replay socket filled."""
    restarts: int = 0
    """The publisher's sequence started again (the engine restarted)."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Messages or events not followed, by why: malformed, orphan (parent unknown), block_size
    (another block size), other (another tier or group, an unknown type), connection (the connection
    broke: a message over ``max_message_bytes``, or the publisher went away)."""

    def drop(self, why: str, n: int = 1) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + n


WARN_EVERY_S = 60.0
"""A follower's warning about its subscription breaking is written at most this often (with how many
breaks it stands for): a publisher that keeps refusing cannot flood the log."""


class KVEventFollower:
    """One backend's events and exact index (see the module docstring). :meth:`receive` is the
    protocol; :meth:`run` feeds it from ZMQ and fills gaps from the replay socket."""

    def __init__(
        self,
        name: str,
        source: BackendKVEvents,
        opts: KVEventsSettings,
        capacity_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.source = source
        self.opts = opts
        self.clock = clock
        self.block_size: int | None = source.block_size
        self._capacity_tokens = capacity_tokens
        self.index = ExactIndex(capacity_tokens // (self.block_size or 16))
        self.last_seq: int | None = None
        self.resync_until = -float("inf")
        self.sent_at: float | None = None
        """When a request was first sent there since the last message (None: none since)."""
        self.broken = False
        """The subscription broke and no message has come on the new one yet."""
        self._ctx: Any = None
        """The ZMQ context :meth:`run` opened (its subscription and replay sockets)."""
        self.counts = Counts()
        self._broke_log = RateLimitedLog(
            log,
            "KV events: %d broken subscription(s) (backend %s): a message over max_message_bytes, or "
            "the publisher went away; resubscribed, placing by the approximate index until a batch comes",
            every_s=WARN_EVERY_S,
            clock=clock,
        )

    # --- what placement reads -----------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.last_seq is None or self.block_size is None:
            return "waiting"
        if self.broken:
            return "disconnected"
        now = self.clock()
        if now < self.resync_until:
            return "resync"
        if self.sent_at is not None and now - self.sent_at > self.opts.stale_s:
            return "stale"
        return "precise"

    @property
    def precise(self) -> bool:
        return self.state == "precise"

    def note_sent(self) -> None:
        """A request went to this backend: events should follow."""
        if self.sent_at is None:
            self.sent_at = self.clock()

    # --- what the backend's probes tell ---------------------------------------------------------
    def lost(self) -> None:
        """The backend went down or restarted: its cache is gone or unknown; listen afresh (the next
        message decides: a publisher starting again from 0 is a new engine, exact at once)."""
        self.index.clear()
        self.last_seq = None
        self.sent_at = None
        self.broken = False
        self.resync_until = -float("inf")

    def disconnected(self) -> None:
        """The subscription broke (:meth:`run` opens a new one): until a message comes on it, what
        was missed is unknown, so the backend is not precise; that message's sequence decides."""
        self.broken = True
        self.counts.drop("connection")
        self._broke_log.note(self.name)

    def resize(self, capacity_tokens: int) -> None:
        self._capacity_tokens = capacity_tokens
        if self.block_size:
            self.index.resize(capacity_tokens // self.block_size)

    def engine_block_size(self, block_size: int | None) -> None:
        """The block size the engine reports (``vllm:cache_config_info``), if none is known yet."""
        if self.block_size is None and block_size:
            self._learn_block_size(block_size)

    def _learn_block_size(self, block_size: int) -> None:
        self.block_size = block_size
        self.index.resize(self._capacity_tokens // block_size)

    # --- the protocol -----------------------------------------------------------------------------
    def receive(self, seq: int, payload: bytes) -> tuple[int, int] | None:
        """One live message. Returns ``(first, seq)`` when batches ``first .. seq-1`` are missing and
        worth asking the replay socket for (:meth:`run` does, then applies them and this one); else it
        is applied (after clearing the index, if batches were missed)."""
        self.sent_at = None
        self.broken = False
        self.counts.batches += 1
        if self.last_seq is not None and seq <= self.last_seq:
            # The sequence went back: a new publisher, so a new engine with an empty cache.
            self.counts.restarts += 1
            self.lost()
        first = 0 if self.last_seq is None else self.last_seq + 1
        if seq > first:
            if self.last_seq is not None:
                self.counts.gaps += 1
            if self.source.replay_endpoint is not None and seq - first <= self.opts.max_replay_batches:
                return first, seq
            self._desync()
        self._apply(seq, payload)
        return None

    def _desync(self) -> None:
        self.index.clear()
        self.resync_until = self.clock() + self.opts.resync_s

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        c = self.counts
        try:
            events, skipped = decode_batch(payload)
            c.drop("other", skipped)
            for ev in events:
                if isinstance(ev, Removed):
                    self.index.removed(ev.hashes)
                    c.removed += len(ev.hashes)
                elif isinstance(ev, Cleared):
                    self.index.clear()
                    self.resync_until = -float("inf")  # the engine is empty: the index is exact again
                    c.cleared += 1
                else:
                    if self.block_size is None:
                        self._learn_block_size(ev.block_size)
                    if ev.block_size != self.block_size:
                        c.drop("block_size")
                    elif self.index.stored(ev):
                        c.stored += len(ev.hashes)
                    else:
                        c.drop("orphan")
        except Malformed as exc:
            c.drop("malformed")
            log.warning(
                "backend %s: malformed KV event batch %d (%s): rebuilding its index", self.name, seq, exc
            )
            self._desync()

    # --- ZMQ ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe and follow until cancelled: a broken subscription is opened again at once (see
        the module docstring), a failing one after a second."""
        import zmq
        import zmq.asyncio

        self._ctx = ctx = zmq.asyncio.Context()  # its own: ended here, never by a collector at exit
        try:
            while True:
                sock = self._subscribe(ctx)
                monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                try:
                    await self._follow(sock, monitor)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("backend %s: KV event subscriber failed; reconnecting", self.name)
                    await asyncio.sleep(1.0)
                finally:
                    sock.disable_monitor()
                    monitor.close(0)
                    sock.close(0)
        finally:
            ctx.destroy(linger=0)

    def _subscribe(self, ctx: Any) -> Any:
        import zmq

        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.opts.receive_hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.opts.max_message_bytes)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        sock.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sock.connect(self.source.endpoint)
        return sock

    async def _follow(self, sock: Any, monitor: Any) -> None:
        """Apply messages until the connection breaks: then the ones already queued, and return."""
        import zmq
        import zmq.asyncio

        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if sock in ready:
                await self._message(await sock.recv_multipart())
                await asyncio.sleep(0)  # a flood of ready messages must not starve the loop
            if monitor in ready:
                await monitor.recv_multipart()  # only disconnections are asked for
                while True:
                    try:
                        frames = await sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    await self._message(frames)
                self.disconnected()
                return

    async def _message(self, frames: list[bytes]) -> None:
        # (topic, seq, payload); vLLM's snapshot mode appends an identity to the 8-byte sequence
        if len(frames) != 3 or len(frames[1]) < 8:
            self.counts.drop("malformed")
            return
        seq = int.from_bytes(frames[1][:8], "big")
        missing = self.receive(seq, frames[2])
        if missing is not None:
            await self._fill(missing[0], seq, frames[2])

    async def _fill(self, first: int, seq: int, payload: bytes) -> None:
        """Batches ``first .. seq-1`` are missing: apply them from the replay socket (the loop
        yielded between them), else rebuild; then batch ``seq``."""
        before = self.last_seq
        replayed = await self.replay(first, seq)
        if self.last_seq != before:  # the backend was lost meanwhile: the next message decides
            return
        if replayed is None:
            self._desync()
        else:
            self.counts.replayed += 1
            for i, old in enumerate(replayed):
                self._apply(first + i, old)
                await asyncio.sleep(0)
        self._apply(seq, payload)

    async def replay(self, first: int, stop: int) -> list[bytes] | None:
        """Batches ``first .. stop-1`` from the replay socket, or None if it cannot give them all."""
        import zmq
        import zmq.asyncio

        assert self.source.replay_endpoint is not None and self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        out: list[bytes] = []
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.opts.max_message_bytes)
            sock.connect(self.source.replay_endpoint)
            await sock.send_multipart([b"", first.to_bytes(8, "big")])
            deadline = self.clock() + self.opts.replay_timeout_s
            size = 0
            while len(out) < stop - first:
                wait_ms = int(max(0.0, deadline - self.clock()) * 1000)
                if not await sock.poll(wait_ms):
                    return None
                frames = await sock.recv_multipart()
                # ("", topic, seq, payload) as vLLM 0.32 replays; earlier vLLM sent no topic
                if len(frames) not in (3, 4) or frames[0] or len(frames[-2]) != 8:
                    return None
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ or seq > first + len(out):
                    return None  # ended early, or the buffer no longer reaches back that far
                if seq == first + len(out):
                    out.append(frames[-1])
                    size += len(frames[-1])
                    if size > REPLAY_MAX_BYTES:
                        return None
                await asyncio.sleep(0)
            return out
        except zmq.ZMQError:
            return None
        finally:
            sock.close(0)


# --- the fleet's followers, their tasks and metrics ----------------------------------------------------
class KVEventHub:
    """A follower for every backend configured with ``kv_events`` (set as ``Backend.kv``)."""

    def __init__(
        self, backends: Sequence[Backend], sources: Sequence[BackendKVEvents | None], opts: KVEventsSettings
    ):
        self.followers: list[KVEventFollower] = []
        for b, source in zip(backends, sources, strict=True):
            if source is not None:
                b.kv = KVEventFollower(b.name, source, opts, b.load.capacity_tokens)
                self.followers.append(b.kv)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(f.run(), name=f"kv-events-{f.name}") for f in self.followers]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def collect(self) -> Iterable[Any]:
        """The followers' state and counters (``GatewayMetrics.attach_state``)."""
        state = GaugeMetricFamily(
            "sagegate_kv_events_state",
            "1 for the state a backend's KV events are in: precise (placed by its exact index), waiting "
            "(no event yet), resync (rebuilding after a gap), stale (requests sent, no event since), "
            "disconnected (the subscription broke; reopened, no batch on it yet).",
            labels=["backend", "state"],
        )
        blocks = GaugeMetricFamily(
            "sagegate_kv_events_index_blocks",
            "Blocks the engine reports cached (the exact index).",
            labels=["backend"],
        )
        seq = GaugeMetricFamily(
            "sagegate_kv_events_last_seq", "The last batch's sequence number.", labels=["backend"]
        )
        batches = CounterMetricFamily(
            "sagegate_kv_events_batches", "KV event batches received.", labels=["backend"]
        )
        blocks_seen = CounterMetricFamily(
            "sagegate_kv_events_blocks",
            "Blocks reported stored or removed, and cache clears.",
            labels=["backend", "event"],
        )
        gaps = CounterMetricFamily(
            "sagegate_kv_events_gaps",
            "Sequence gaps (what=gap), those the replay socket filled (replayed), publisher restarts "
            "(restart).",
            labels=["backend", "what"],
        )
        dropped = CounterMetricFamily(
            "sagegate_kv_events_dropped",
            "Messages or events not followed, by why (connection: the subscription broke, by a message "
            "over max_message_bytes or a publisher gone, and was reopened).",
            labels=["backend", "why"],
        )
        for f in self.followers:
            now = f.state
            for s in STATES:
                state.add_metric([f.name, s], 1.0 if s == now else 0.0)
            blocks.add_metric([f.name], len(f.index))
            seq.add_metric([f.name], -1 if f.last_seq is None else f.last_seq)
            c = f.counts
            batches.add_metric([f.name], c.batches)
            for event, n in (("stored", c.stored), ("removed", c.removed), ("cleared", c.cleared)):
                blocks_seen.add_metric([f.name, event], n)
            for what, n in (("gap", c.gaps), ("replayed", c.replayed), ("restart", c.restarts)):
                gaps.add_metric([f.name, what], n)
            for why, n in {**c.dropped, "capacity": f.index.dropped}.items():
                dropped.add_metric([f.name, why], n)
        return [state, blocks, seq, batches, blocks_seen, gaps, dropped]
