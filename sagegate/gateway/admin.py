"""``/admin/queue``: what the gateway holds right now, for an operator (and the tests) to read.

The queue in rank order (each request's rank key, prediction and wait) and every backend's load.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from sagegate.gateway.backends import Backend, BackendPool
from sagegate.gateway.queue import BoundedQueue, GatewayRequest

MAX_LIMIT = 10_000
"""At most this many queued requests are listed, whatever ``limit`` asks."""


def queue_snapshot(
    policy_name: str,
    queue: BoundedQueue,
    pool: BackendPool,
    now: float,
    limit: int,
    pausable: Iterable[GatewayRequest] = (),
) -> dict[str, Any]:
    """The admin payload: the first ``limit`` queued requests (by rank), the backends, and (with
    ``pause.enabled``) the running requests that could be paused now."""
    requests = [_queued(rank, r, now) for rank, r in enumerate(queue.ordered(now, limit))]
    running = [
        {"id": r.rid, "backend": r.backend, "generated": r.generated, "pauses": r.pauses}
        for r in itertools.islice(pausable, limit)
    ]
    return {
        "pausable": running,
        "policy": policy_name,
        "queued": len(queue),
        "queued_tokens": queue.tokens,
        "prompt_share": pool.prompt_share,
        "requests": requests,
        "backends": [_backend(b) for b in pool.backends],
    }


def _queued(rank: int, r: GatewayRequest, now: float) -> dict[str, Any]:
    pred = r.prediction
    return {
        "rank": rank,
        "id": r.rid,
        "key": repr(r.key_cache),
        "tenant": r.tenant,
        "model": r.model,
        "prompt_tokens": r.prompt_tokens,
        "priority": r.priority,
        "deadline_in_s": None if r.deadline_s is None else r.deadline_s - now,
        "prediction": None if pred is None else pred.summary(),
        "predictor_path": r.prediction_path,
        "wait_s": now - r.t_enqueue,
        "attempt": r.attempt,
    }


def _backend(b: Backend) -> dict[str, Any]:
    return {
        "name": b.name,
        "url": b.shown_url,
        "healthy": b.healthy,
        "inflight": b.inflight,
        "reserved_tokens": b.load.charged_tokens,
        "capacity_tokens": b.load.capacity_tokens,
        "waiting": b.load.waiting,
        "prompt_share": b.prompt_share.value,
        "prompt_share_samples": b.prompt_share.samples,
        "circuit_open": b.breaker.is_open,
        "kv_events": b.kv.state if b.kv is not None else None,
        "speed": _speed(b),
    }


def _speed(b: Backend) -> dict[str, float]:
    """Its speed as learned from its counters (``policies.engine_speed``), and from how many intervals."""
    s = b.speed.fit.speed
    return {
        "prefill_s_per_token": s.prefill_s,
        "step_s": s.step_s,
        "step_s_per_running": s.per_seq_s,
        "intervals": b.speed.fit.intervals,
    }
