"""The gateway's state gauges, read from the live queue and backends when ``/metrics`` is scraped
(keeping them costs nothing per request); registered with ``GatewayMetrics.attach_state``."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from sagegate.gateway.backends import BackendPool
from sagegate.gateway.queue import BoundedQueue


class StateGauges:
    """A callable for ``GatewayMetrics.attach_state``: queue depth and per-backend load."""

    def __init__(self, queue: BoundedQueue, pool: BackendPool) -> None:
        self.queue = queue
        self.pool = pool

    def __call__(self) -> list[GaugeMetricFamily]:
        depth = GaugeMetricFamily("sagegate_queue_depth", "Requests waiting in the gateway's queue.")
        depth.add_metric([], len(self.queue))
        tokens = GaugeMetricFamily("sagegate_queue_prompt_tokens", "Prompt tokens waiting in the queue.")
        tokens.add_metric([], self.queue.tokens)
        share = GaugeMetricFamily(
            "sagegate_prompt_share", "Share of a prompt's tokens charged to a backend's KV (prefix sharing)."
        )
        share.add_metric([], self.pool.prompt_share)
        labels = ["backend"]
        inflight = GaugeMetricFamily(
            "sagegate_backend_inflight", "Requests in flight per backend.", labels=labels
        )
        reserved = GaugeMetricFamily(
            "sagegate_backend_reserved_kv_tokens",
            "KV tokens charged to a backend's in-flight requests.",
            labels=labels,
        )
        capacity = GaugeMetricFamily(
            "sagegate_backend_capacity_kv_tokens", "Backend KV capacity.", labels=labels
        )
        healthy = GaugeMetricFamily(
            "sagegate_backend_healthy", "1 if the backend takes requests.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "sagegate_backend_waiting",
            "Backend's waiting requests (scraped, plus sent since).",
            labels=labels,
        )
        hit_rate = GaugeMetricFamily(
            "sagegate_backend_prefix_hit_rate",
            "The backend's own prefix cache hit rate since it started (vllm:prefix_cache_hits / "
            "queries, as last scraped; absent when it reports none).",
            labels=labels,
        )
        indexed = GaugeMetricFamily(
            "sagegate_backend_prefix_index_blocks",
            "Prompt blocks the gateway predicts cached on the backend (its prefix index).",
            labels=labels,
        )
        for b in self.pool.backends:
            m = b.metrics
            if m is not None and m.prefix_queries and m.prefix_hits is not None:
                hit_rate.add_metric([b.name], m.prefix_hits / m.prefix_queries)
            indexed.add_metric([b.name], len(b.prefix))
            inflight.add_metric([b.name], b.inflight)
            reserved.add_metric([b.name], b.load.charged_tokens)
            capacity.add_metric([b.name], b.load.capacity_tokens)
            healthy.add_metric([b.name], 1.0 if b.healthy else 0.0)
            waiting.add_metric([b.name], b.load.waiting)
        return [depth, tokens, share, inflight, reserved, capacity, healthy, waiting, hit_rate, indexed]
