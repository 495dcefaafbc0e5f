"""Replicas share the prefix index through Redis (``placement.share``, with ``redis_url``).

Each replica predicts what a backend caches from the requests it sent there (``gateway.locality``).
Behind a load balancer a conversation's turns land on different replicas, and the one that gets turn
2 never saw turn 1 go to backend X. So every replica publishes what it touches in its index (a
request's block keys when it is placed, and again when it leaves: the engine frees its blocks then,
into its eviction order), and applies what the others publish to its own index, as if it had sent
those requests itself; sessions (``x-session-id`` → the backend of the last turn) go along.

* **Transport.** A Redis stream, ``{ledger.prefix}:prefixes``, trimmed to about
  ``stream_maxlen`` messages (so Redis holds a bounded amount, and the key expires an hour after
  the last message). Every replica reads it from the last entry it saw: a replica whose connection
  dropped catches up on what it missed (pub/sub would lose it), and a replica that starts warms its
  index from the messages still held. A replica skips its own messages.
* **Batching.** Touches wait up to ``flush_s`` and go out in one message; a key touched twice in a
  window goes once, at its last touch (``gateway.shared_prefixes_parts``: 4 bytes a key, backends
  named by URL, so replicas that list the fleet in different orders agree). At most one message per window and
  ``max_message_blocks`` keys a message; what waits is bounded by ``max_pending_blocks`` (the
  oldest dropped, counted).
* **Failure.** Nothing on a request's path waits for Redis: a touch only adds to the pending batch.
  A publish or read that fails or takes longer than ``timeout_s`` marks its side down (metric, an
  INFO line at most every 10 s) and is retried with backoff (doubling up to ``max_backoff_s``); a
  failed batch is put back to go out when Redis answers. Meanwhile each replica places on its own
  index. A message that does not parse, was keyed with another block size, or comes beyond
  ``max_apply_blocks_per_s`` is dropped and counted; blocks of a backend this replica does not know
  (or holds down: predicted empty) are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from sagegate.gateway.backends import Backend
from sagegate.gateway.locality import Locality
from sagegate.gateway.metrics import RateLimitedLog
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.settings_share import ShareSettings
from sagegate.gateway.shared_prefixes_parts import (
    MAX_BACKENDS,
    MAX_NAME_BYTES,
    REPLICA_BYTES,
    Batching,
    Malformed,
    ShareStats,
    decode,
    encode,
    sender,
)

log = logging.getLogger("sagegate.gateway")

MAX_MESSAGE_BYTES = 1 << 20
"""A longer message is dropped unread (a batch of this code is at most ~330 KB)."""
READ_BLOCK_S = 1.0
"""A read waits this long for news (then reads again)."""
READ_COUNT = 16
"""Messages one read brings at most (applied one at a time, the event loop free between them)."""
STREAM_TTL_MS = 3_600_000
MIN_BACKOFF_S = 0.05
LOG_EVERY_S = 10.0


class SharedPrefixes:
    """One replica's side of the shared prefix index (see the module docstring)."""

    def __init__(
        self,
        settings: ShareSettings,
        redis_url: str,
        key: str,
        locality: Locality,
        backends: Sequence[Backend],
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.key = key
        """The stream's key in Redis."""
        self.locality = locality
        self.backends = backends
        self.ids = [b.shown_url for b in backends]
        """How replicas name a backend (its URL without credentials, as the shared ledger does)."""
        self.index_of = {url: i for i, url in enumerate(self.ids)}
        self.block_tokens = locality.block_tokens
        self.clock = clock
        self.replica = os.urandom(REPLICA_BYTES)
        self.stats = ShareStats(registry)
        self.batch = Batching(len(backends), settings.max_pending_blocks)
        """What waits to be published."""
        self._wake = asyncio.Event()
        self._bucket = settings.max_apply_blocks_per_s
        self._bucket_at = clock()
        self.up = {"publish": False, "read": False}
        self._backoff = {"publish": 0.0, "read": 0.0}
        self._retry_at = {"publish": 0.0, "read": 0.0}
        self._down_log = RateLimitedLog(
            log,
            "prefix sharing: %d failed Redis call(s) (%s); placing on this replica's own index until it "
            "answers",
            every_s=LOG_EVERY_S,
            level=logging.INFO,
        )
        self._up_log = RateLimitedLog(
            log, "prefix sharing: %d (re)connection(s) to Redis (%s)", every_s=LOG_EVERY_S, level=logging.INFO
        )
        self.last_id: bytes | str = "0-0"
        """The last stream entry read (from the start: a replica that starts warms its index)."""
        self._writer: Any = None
        self._reader: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        for side in self.up:
            self.stats.up.labels(side).set(0)
        self.stats.pending.set_function(lambda: self.batch.total)

    # --- life ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Hook into the locality and start the two workers (nothing here waits for Redis)."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        t = self.settings.timeout_s
        opts: dict[str, Any] = {"socket_connect_timeout": t, "retry": Retry(NoBackoff(), 0)}
        self._writer = aioredis.Redis.from_url(self.redis_url, socket_timeout=t, **opts)
        self._reader = aioredis.Redis.from_url(self.redis_url, socket_timeout=READ_BLOCK_S + t, **opts)
        self.locality.on_touch = self.touched
        self._tasks = [
            asyncio.create_task(self._forever(self._publish_loop), name="prefix-share-publish"),
            asyncio.create_task(self._forever(self._read_loop), name="prefix-share-read"),
        ]

    async def stop(self) -> None:
        """Stop both workers; what is pending goes out in one last try if Redis answers."""
        self.locality.on_touch = None
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=READ_BLOCK_S + 2 * self.settings.timeout_s + 1)
        self._tasks = []
        if self.up["publish"] and self.batch:
            await self._publish_one()
        for client in (self._writer, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _forever(self, loop: Callable[[], Awaitable[None]]) -> None:
        """A worker must never die: an unexpected error is logged and the worker starts again."""
        while not self._stopping:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("prefix sharing: a worker failed unexpectedly")
                await asyncio.sleep(1.0)

    # --- publishing ---------------------------------------------------------------------------
    def touched(self, backend: int, keys: Sequence[int], session: str | None, prompt_tokens: int) -> None:
        """``gateway.locality`` touched ``keys`` on ``backend`` (the request path: no I/O here)."""
        dropped = self.batch.touch(backend, keys, session if self.settings.sessions else None, prompt_tokens)
        if dropped:
            self.stats.dropped_blocks.labels("overflow").inc(dropped)
        self._wake.set()

    async def _publish_loop(self) -> None:
        s = self.settings
        while not self._stopping:
            await self._wake.wait()
            await asyncio.sleep(s.flush_s)  # the window: what is touched meanwhile rides along
            self._wake.clear()
            while self.batch:
                wait = self._retry_at["publish"] - self.clock()
                if wait > 0:  # Redis away: the batch waits (bounded) for the next attempt
                    await asyncio.sleep(wait)
                    continue
                await self._publish_one()
                if self.batch:
                    await asyncio.sleep(s.flush_s)  # at most one message a window

    async def _publish_one(self) -> None:
        touches, sessions = self.batch.take(self.settings.max_message_blocks)
        blocks = sum(len(keys) for _, keys in touches)
        try:
            data = encode(self.replica, self.block_tokens, [(self.ids[i], k) for i, k in touches], sessions)
        except (ValueError, OverflowError):  # a key that is not a 32-bit CRC: a bug, not Redis's fault
            log.exception("prefix sharing: a batch could not be encoded")
            self.stats.dropped_blocks.labels("malformed").inc(blocks)
            return
        try:
            pipe = self._writer.pipeline(transaction=False)
            pipe.xadd(self.key, {"m": data}, maxlen=self.settings.stream_maxlen, approximate=True)
            pipe.pexpire(self.key, STREAM_TTL_MS)
            await asyncio.wait_for(pipe.execute(), self.settings.timeout_s)
        except Exception as exc:  # unreachable, slow or refused: the batch goes out later
            dropped = self.batch.put_back(touches, sessions)
            if dropped:
                self.stats.dropped_blocks.labels("overflow").inc(dropped)
            self._failed("publish", exc)
            return
        self._ok("publish")
        self.stats.messages.labels("published").inc()
        self.stats.blocks.labels("published").inc(blocks)
        self.stats.sessions.labels("published").inc(len(sessions))

    # --- reading ------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while not self._stopping:
            wait = self._retry_at["read"] - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                got = await asyncio.wait_for(
                    self._reader.xread(
                        {self.key: self.last_id}, count=READ_COUNT, block=int(READ_BLOCK_S * 1000)
                    ),
                    READ_BLOCK_S + self.settings.timeout_s,
                )
            except Exception as exc:
                self._failed("read", exc)
                continue
            self._ok("read")
            streams = got.items() if isinstance(got, dict) else (got or [])
            for _, entries in streams:
                for entry_id, fields in entries:
                    self.last_id = entry_id
                    self.apply(fields.get(b"m") if isinstance(fields, dict) else None)
                    await asyncio.sleep(0)  # one message at a time: requests go between them

    def apply(self, data: object) -> None:
        """Apply one message from the stream to this replica's index (its own are skipped)."""
        st = self.stats
        if not isinstance(data, bytes):
            st.dropped_messages.labels("malformed").inc()
            return
        if len(data) > MAX_MESSAGE_BYTES:
            st.dropped_messages.labels("too_large").inc()
            return
        if sender(data) == self.replica:
            return
        try:
            batch = decode(data)
        except Malformed:
            st.dropped_messages.labels("malformed").inc()
            return
        if batch.block_tokens != self.block_tokens:
            st.dropped_messages.labels("block_size").inc()
            return
        if not self._afford(1 + len(data) // 4):
            st.dropped_messages.labels("rate").inc()
            return
        local: list[int | None] = []
        applied = 0
        for name, keys in batch.touches:
            i = self.index_of.get(name)
            local.append(i)
            if i is None or not self.backends[i].healthy:
                if keys:
                    st.dropped_blocks.labels("unknown_backend" if i is None else "unhealthy_backend").inc(
                        len(keys)
                    )
                continue
            self.backends[i].prefix.touch(keys)
            applied += len(keys)
        sessions = 0
        if self.settings.sessions:
            loc = self.locality
            for sid, at, tokens in batch.sessions:
                i = local[at]
                if i is None:
                    continue
                loc.sessions.put(sid, (i, tokens))
                sessions += 1
        st.messages.labels("applied").inc()
        st.blocks.labels("applied").inc(applied)
        st.sessions.labels("applied").inc(sessions)

    def _afford(self, cost: int) -> bool:
        """A token bucket of ``max_apply_blocks_per_s`` (one second's worth of burst)."""
        rate = self.settings.max_apply_blocks_per_s
        now = self.clock()
        self._bucket = min(rate, self._bucket + rate * (now - self._bucket_at))
        self._bucket_at = now
        if self._bucket < cost:
            return False
        self._bucket -= cost
        return True

    # --- the connection's state ----------------------------------------------------------------
    def _failed(self, side: str, exc: BaseException) -> None:
        self.stats.failures.labels(side).inc()
        self.stats.up.labels(side).set(0)
        self.up[side] = False
        backoff = min(self.settings.max_backoff_s, max(MIN_BACKOFF_S, 2 * self._backoff[side]))
        self._backoff[side] = backoff
        self._retry_at[side] = self.clock() + backoff * random.uniform(0.5, 1.0)
        self._down_log.note(side)
        log.debug("prefix sharing: %s failed: %r", side, exc)

    def _ok(self, side: str) -> None:
        self._backoff[side] = 0.0
        if not self.up[side]:
            self.up[side] = True
            self.stats.up.labels(side).set(1)
            self._up_log.note(side)


def shared_prefixes(
    settings: GatewaySettings,
    locality: Locality | None,
    backends: Sequence[Backend],
    registry: CollectorRegistry,
) -> SharedPrefixes | None:
    """The shared index, if this replica has one: ``redis_url``, cache-aware placement (``locality``)
    and ``placement.share.enabled``."""
    share = settings.placement.share
    if locality is None or not settings.redis_url or not share.enabled:
        return None
    if len(backends) > MAX_BACKENDS or any(len(b.shown_url.encode()) > MAX_NAME_BYTES for b in backends):
        log.warning(
            "prefix sharing off: over %d backends, or a URL over %d bytes", MAX_BACKENDS, MAX_NAME_BYTES
        )
        return None
    key = f"{settings.ledger.prefix}:prefixes"
    return SharedPrefixes(share, settings.redis_url, key, locality, backends, registry)
