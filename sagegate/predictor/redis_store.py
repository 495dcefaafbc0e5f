"""The shared history: a Redis stream that every gateway replica appends to and consumes.

Two background threads per replica do all Redis I/O, each on its own connection: a writer that sends
buffered completions as soon as they arrive (pipelined XADD with an approximate MAXLEN; an occasional
XTRIM MINID applies the age bound), and a reader that blocks on XREAD for what other replicas wrote and
hands it to the predictor. So a completion seen by one replica reaches the others' indexes within a few
round trips, and the request path never touches Redis.

Failures: any Redis error or timeout counts one degraded moment, marks the store disconnected and backs
off (100 ms doubling to 1 s). Appends keep accumulating in a bounded buffer meanwhile (oldest dropped,
counted). An ``epoch`` key tells a restart that lost the data (no persistence) from a mere disconnect:
on a new epoch the replica re-sends its own recent completions (a bounded log) and re-reads the stream
from the start, so a Redis restart loses no completion that a live replica still remembers.

Each completion is written exactly once: the append is a script that adds the completion's id to a
sorted set of written ids (``{prefix}:ids``, scored by timestamp) and appends to the stream only if
the id was new. So neither a re-seed racing the writer's own flush after a restart, nor a batch
retried after a timeout that had in fact been applied, duplicates an entry. The set is trimmed with
the stream (by age, and to twice the stream's length); it lives and dies with the stream, so after a
restart that lost the data both are empty together.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from sagegate.predictor.history import Completion, Deliver, StoreStats, WindowBounds, wall_clock

log = logging.getLogger(__name__)

# KEYS: stream, ids. ARGV: stream maxlen, ids cap, id, timestamp, then the entry's field/value pairs.
_APPEND_ONCE = """
if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[3]) == 0 then return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 5))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1) end
return 1
"""


class RedisStore:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "sagegate:history",
        bounds: WindowBounds | None = None,
        *,
        buffer_size: int = 10_000,
        own_log_size: int = 20_000,
        stream_maxlen: int | None = None,
        block_ms: int = 200,
        socket_timeout: float = 1.0,
        clock: Callable[[], float] = wall_clock,
        replica_id: str | None = None,
        embedded: bool = True,
    ) -> None:
        self.url = url
        self.embedded = embedded
        """Whether the records carry embeddings (a semantic history) or not (a history baseline's)."""
        self.prefix = prefix
        self.bounds = bounds or WindowBounds()
        self.stream_key = f"{prefix}:stream"
        self.epoch_key = f"{prefix}:epoch"
        self.ids_key = f"{prefix}:ids"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        self.block_ms = block_ms
        self.stream_maxlen = stream_maxlen or self.bounds.max_entries
        self.clock = clock
        self._socket_timeout = max(socket_timeout, 2 * block_ms / 1000)
        self._pending: deque[Completion] = deque()
        self._buffer_size = buffer_size
        self._own: deque[Completion] = deque(maxlen=own_log_size)
        self._lock = threading.Lock()
        self._stats = StoreStats(connected=False)
        self._deliver: Deliver | None = None
        self._last_id = "0-0"
        self._epoch: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_trim = 0.0
        self._clients: dict[str, Any] = {}

    # --- the interface ------------------------------------------------------------------------
    def start(self, deliver: Deliver) -> list[Completion]:
        """Rebuild from the stream (empty when Redis is down) and start the reader and writer threads."""
        self._deliver = deliver
        records: list[Completion] = []
        try:
            self._check_epoch()
            records = self._load()
            self._connected()
        except Exception as exc:
            self._degraded(exc, "reader")
        for role, step in (("reader", self._read_step), ("writer", self._write_step)):
            t = threading.Thread(
                target=self._loop, args=(role, step), name=f"sagegate-redis-{role}", daemon=True
            )
            self._threads.append(t)
            t.start()
        return records

    def append(self, record: Completion) -> None:
        with self._lock:
            self._stats.appended += 1
            self._own.append(record)
            if len(self._pending) >= self._buffer_size:
                self._pending.popleft()
                self._stats.dropped += 1
            self._pending.append(record)
            self._stats.buffered = len(self._pending)
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=2 + self._socket_timeout)
        with contextlib.suppress(Exception):  # last best-effort flush
            self._flush()
        self._wake.clear()
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()

    def stats(self) -> StoreStats:
        with self._lock:
            self._stats.buffered = len(self._pending)
        return self._stats

    def flush_wait(self, timeout: float = 5.0) -> bool:
        """Wait until the buffer is empty (tests, shutdown); True when it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and self._stats.connected:
                    return True
            time.sleep(0.01)
        return False

    # --- Redis --------------------------------------------------------------------------------
    def _redis(self, role: str = "reader") -> Any:
        """One client per thread role, recreated after a failure (the old socket may be half-closed)."""
        client = self._clients.get(role)
        if client is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            client = self._clients[role] = redis.Redis.from_url(
                self.url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
            )
        return client

    def _check_epoch(self) -> None:
        """Detect a Redis that lost our data; then re-send our own completions and re-read all."""
        r = self._redis("reader")
        r.set(self.epoch_key, uuid.uuid4().hex, nx=True)
        raw = r.get(self.epoch_key)
        epoch = raw.decode() if isinstance(raw, bytes) else str(raw)
        if self._epoch is not None and epoch != self._epoch:
            horizon = self.bounds.horizon(self.clock())
            with self._lock:
                self._pending = deque(rec for rec in self._own if rec.ts >= horizon)
                self._stats.reseeds += 1
            self._last_id = "0-0"
            log.warning(
                "redis history %s was reset; re-sending %d own completions", self.prefix, len(self._pending)
            )
        self._epoch = epoch

    def _load(self) -> list[Completion]:
        r = self._redis("reader")
        horizon = self.bounds.horizon(self.clock())
        out: list[Completion] = []
        start = "-"
        while True:
            chunk = r.xrange(self.stream_key, min=start, max="+", count=2000)
            if not chunk:
                break
            for _entry_id, fields in chunk:
                rec = self._parse(fields)
                if rec is not None and rec.ts >= horizon:
                    out.append(rec)
            last = chunk[-1][0]
            self._last_id = last.decode() if isinstance(last, bytes) else str(last)
            start = f"({self._last_id}"
        return out

    def _loop(self, role: str, step: Callable[[], bool]) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if step():  # only a step that reached Redis says it is back
                    self._connected()
                backoff = 0.1
            except Exception as exc:
                self._degraded(exc, role)
                self._stop.wait(backoff)
                backoff = min(1.0, backoff * 2)

    def _read_step(self) -> bool:
        self._check_epoch()
        self._read()
        self._trim()
        return True

    def _write_step(self) -> bool:
        self._wake.wait(0.1)
        self._wake.clear()
        return self._flush() > 0

    def _flush(self) -> int:
        """Write the buffer out; returns how many were written."""
        written = 0
        while True:
            with self._lock:
                batch = list(self._pending)[:256]
            if not batch:
                return written
            client = self._redis("writer")
            append_once = client.register_script(_APPEND_ONCE)
            pipe = client.pipeline(transaction=False)
            keys = [self.stream_key, self.ids_key]
            for rec in batch:
                fields = rec.to_fields()
                fields["src"] = self.replica_id
                args = [self.stream_maxlen, 2 * self.stream_maxlen, rec.id, repr(float(rec.ts))]
                args += [x for kv in fields.items() for x in kv]
                append_once(keys=keys, args=args, client=pipe)
            pipe.execute()
            with self._lock:
                for rec in batch:  # the batch is the buffer's left end, unless overflow dropped some
                    if self._pending and self._pending[0] is rec:
                        self._pending.popleft()
                self._stats.written += len(batch)
                self._stats.buffered = len(self._pending)
            written += len(batch)

    def _read(self) -> None:
        resp = self._redis("reader").xread({self.stream_key: self._last_id}, count=1000, block=self.block_ms)
        if not resp:
            return
        fresh: list[Completion] = []
        for _stream, entries in resp:
            for entry_id, fields in entries:
                self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                src = fields.get(b"src", b"")
                if (src.decode() if isinstance(src, bytes) else src) == self.replica_id:
                    continue
                rec = self._parse(fields)
                if rec is not None:
                    fresh.append(rec)
        if fresh and self._deliver is not None:
            self._stats.received += len(fresh)
            self._deliver(fresh)

    def _trim(self) -> None:
        now = time.monotonic()
        if now - self._last_trim < 10.0 or self.bounds.max_age_s == float("inf"):
            return
        self._last_trim = now
        horizon = self.bounds.horizon(self.clock())
        min_ms = int(1000 * horizon)
        r = self._redis("reader")
        r.xtrim(self.stream_key, minid=f"{max(0, min_ms)}-0", approximate=True)
        r.zremrangebyscore(self.ids_key, "-inf", f"({horizon!r}")

    def _parse(self, fields: Any) -> Completion | None:
        try:
            return Completion.from_fields(fields, embedded=self.embedded)
        except Exception:
            log.warning("skipping a malformed history entry")
            return None

    def _connected(self) -> None:
        self._stats.connected = True

    def _degraded(self, exc: BaseException, role: str) -> None:
        if self._stats.connected:
            log.warning("redis history %s unavailable: %s", self.prefix, exc)
        self._stats.degraded += 1
        self._stats.connected = False
        self._stats.last_error = f"{type(exc).__name__}: {exc}"
        client = self._clients.pop(role, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
