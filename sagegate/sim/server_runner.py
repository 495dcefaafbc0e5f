"""The engine loop of the simulated backend (sim/server.py): runs the project's engine model
(sim/engine.py) on a real clock, optionally sped up, and hands each request's tokens to its handler.

Clock. Engine time is ``(loop.time() − t0) × time_scale``. Steps are chained on that clock exactly as
the discrete-event simulator chains them: a step planned at ``s`` ends at ``s + duration`` and the next
one starts there; the loop sleeps until the wall time of each step's end (an absolute deadline), so the
event loop's lateness does not pile up from step to step. Only when the loop falls more than
``max_lag_s`` of wall time behind does engine time jump forward to the wall clock (as a slow GPU would
lose the time). Tokens are delivered when the step that made them ends.

Front end. A request reaches the engine ``perf.frontend_s`` of engine time after the server received
it (tokenisation, HTTP): it waits in a pending list until then, and is admitted by the first step that
starts at or after that time. Arrivals are thus ordered, and a request that arrives during a step joins
the next one — the simulator's rule.

Cancellation. A client that disconnects (streaming: the response is cancelled; non-streaming: the
server sees ``http.disconnect``) aborts its request at once, and the engine frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import ABORTED, FINISHED, EngineRequest

if TYPE_CHECKING:
    from sagegate.sim.kv_events import EventLog, KVEventsConfig, Publisher
    from sagegate.sim.server_metrics import Metrics

SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class BackendSettings:
    """What ``sagegate backend`` is started with."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    time_scale: float = 1.0
    scheduling_policy: str = "fcfs"
    max_lag_s: float = 0.05  # wall seconds the loop may fall behind before engine time jumps ahead
    kv_events: KVEventsConfig | None = None
    """vLLM's ``--kv-events-config``: publish the engine's KV-cache events (``sim.kv_events``)."""
    prompt_tokens_details: bool = False
    """vLLM's ``--enable-prompt-tokens-details``: usage reports ``prompt_tokens_details.cached_tokens``
    (the prompt tokens its first admission found cached)."""
    api_key: str | None = None
    """vLLM's ``--api-key``: a request to a ``/v1`` route without ``Authorization: Bearer KEY`` is
    answered ``401 {"error": "Unauthorized"}``, as vLLM answers it (other routes stay open)."""

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {self.scheduling_policy!r}; "
                f"valid: {', '.join(SCHEDULING_POLICIES)}"
            )
        if self.max_lag_s < 0:
            raise ValueError("max_lag_s must be >= 0")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


class Stream:
    """One request's channel from the engine loop to its HTTP handler: the number of new tokens after
    each step that made some, ``None`` at the end."""

    __slots__ = ("in_engine", "queue", "req", "t_last", "t_receive")

    def __init__(self, req: EngineRequest, t_receive: float) -> None:
        self.req = req
        self.t_receive = t_receive  # engine time the server received the request
        self.t_last = t_receive
        self.in_engine = False
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return self.req.state == FINISHED


class EngineRunner:
    """Drives one :class:`Engine` on the event loop's clock (see the module docstring)."""

    def __init__(self, engine: Engine, settings: BackendSettings, metrics: Metrics) -> None:
        self.engine = engine
        self.scale = settings.time_scale
        self.max_lag = settings.max_lag_s
        self.frontend_s = engine.perf.frontend_s
        self.metrics = metrics
        self.pending: collections.deque[Stream] = collections.deque()  # arrival order = engine order
        self.live: set[Stream] = set()
        self._chain: float | None = None  # engine time the last step ended
        self._next_rid = 0
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.kv_log: EventLog | None = None
        """The engine's cache events since the last publish (``sim.kv_events``; None: events off)."""
        self.kv_publisher: Publisher | None = None

    # --- clock ----------------------------------------------------------------------------------
    def start_clock(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._wake = asyncio.Event()

    def now(self) -> float:
        assert self._loop is not None, "the engine loop has not started"
        return (self._loop.time() - self._t0) * self.scale

    def _wall(self, engine_t: float) -> float:
        return self._t0 + engine_t / self.scale

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not running: the engine's waiting queue plus those still in the front end."""
        return self.engine.num_waiting + sum(1 for s in self.pending if s.req.state != ABORTED)

    # --- requests -------------------------------------------------------------------------------
    def submit(
        self,
        prompt_tokens: int,
        output_tokens: int,
        prompt_key: str | None,
        priority: int,
        content_tokens: int | None = None,
    ) -> Stream:
        """``content_tokens``: ``prompt_key`` describes the output too (``sim.prefix.block_keys``)."""
        t = self.now()
        rid = self._next_rid
        self._next_rid += 1
        req = EngineRequest(
            rid, t + self.frontend_s, prompt_tokens, output_tokens, prompt=prompt_key, priority=priority
        )
        if content_tokens is not None:
            req.keys = (None, prompt_key, content_tokens)
        stream = Stream(req, t)
        req.user = stream
        self.pending.append(stream)
        self.live.add(stream)
        assert self._wake is not None
        self._wake.set()
        return stream

    def cancel(self, stream: Stream) -> None:
        """The client is gone: drop the request; if it holds KV blocks they are freed now."""
        self.live.discard(stream)
        req = stream.req
        if req.state in (FINISHED, ABORTED):
            return
        if stream.in_engine:
            self.engine.abort(req, self.now())
            self.publish_kv_events()
        else:
            req.state = ABORTED  # still in the front end: skipped when its turn comes

    # --- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        eng = self.engine
        loop = self._loop
        wake = self._wake
        assert loop is not None and wake is not None
        while True:
            while self.pending and self.pending[0].req.state == ABORTED:
                self.pending.popleft()
            if not eng.has_work() and not self.pending:
                wake.clear()
                await wake.wait()
                continue
            now = self.now()
            start = self._chain if self._chain is not None else -math.inf
            if not eng.has_work():
                start = max(start, self.pending[0].req.arrival_s)
            start = max(start, now - self.max_lag * self.scale)
            if start > now:  # idle until the next request clears the front end
                await asyncio.sleep(self._wall(start) - loop.time())
                continue
            self._admit_pending(start)
            if not eng.has_work():
                continue
            # horizon=start: one real step at a time (k = 1), never a folded run of decode steps
            step = eng.schedule(start, start)
            if not step.scheduled:  # cannot happen for requests that fit the pool; never spin
                wake.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.1)
                continue
            end = start + step.duration
            await asyncio.sleep(max(0.0, self._wall(end) - loop.time()))
            out = eng.complete(step, end)
            self._chain = end
            self.publish_kv_events()
            self._deliver(out.emitted, out.finished, end, step.k)

    def publish_kv_events(self) -> None:
        """Publish what the cache did since the last call (one batch; nothing when events are off)."""
        if self.kv_publisher is not None and self.kv_log is not None:
            self.kv_publisher.publish(self.kv_log.take())

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``/reset_prefix_cache``: False while requests hold blocks."""
        done = self.engine.pool.reset_prefix_cache()
        self.publish_kv_events()
        return done

    def _admit_pending(self, start: float) -> None:
        pending = self.pending
        while pending and pending[0].req.arrival_s <= start:
            stream = pending.popleft()
            if stream.req.state == ABORTED:
                continue
            stream.in_engine = True
            self.engine.add(stream.req, stream.req.arrival_s)

    def _deliver(
        self, emitted: Iterable[EngineRequest], finished: Iterable[EngineRequest], t: float, k: int
    ) -> None:
        m = self.metrics
        for req in emitted:
            stream: Stream = req.user
            if req.generated == k:
                m.ttft.observe(t - stream.t_receive)
            else:
                m.itl.observe(t - stream.t_last)
            stream.t_last = t
            stream.queue.put_nowait(k)
        for req in finished:
            stream = req.user
            m.e2e.observe(t - stream.t_receive)
            stream.queue.put_nowait(None)
            self.live.discard(stream)

    def shutdown(self) -> None:
        """Wake every handler still waiting so the server can stop."""
        for stream in list(self.live):
            stream.queue.put_nowait(None)
        self.live.clear()
