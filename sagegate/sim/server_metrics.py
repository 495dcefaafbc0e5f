"""The simulated backend's Prometheus metrics under vLLM's names, so that what scrapes a real vLLM
(the gateway, dashboards) reads the simulated one unchanged. Latencies are in engine seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from sagegate.sim.server_runner import BackendSettings, EngineRunner

# Histogram buckets (seconds), spaced like vLLM's own.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
# fmt: on


class Metrics:
    """vLLM's metric names on a registry of this app's own (several servers may share a process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in simulated seconds, front end included.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens in simulated seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in simulated seconds.",
            labels,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.ttft = self._ttft.labels(model_name)
        self.itl = self._itl.labels(model_name)
        self.e2e = self._e2e.labels(model_name)

    def attach(self, runner: EngineRunner, settings: BackendSettings) -> None:
        self.registry.register(_EngineCollector(runner, settings, self.model_name))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, runner: EngineRunner, settings: BackendSettings, model_name: str) -> None:
        self.runner = runner
        self.model_name = model_name
        eng = runner.engine
        cfg = settings.engine
        self.cache_labels = {
            "block_size": str(eng.pool.block_size),
            "num_gpu_blocks": str(eng.pool.num_blocks),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
        }

    def collect(self) -> Iterator[Metric]:
        eng = self.runner.engine
        name = [self.model_name]
        gauges = (
            ("vllm:num_requests_running", "Requests in the running batch.", eng.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", self.runner.num_waiting),
            ("vllm:kv_cache_usage_perc", "Share of KV blocks in use (0..1).", eng.kv_usage),
        )
        for metric, doc, value in gauges:
            g = GaugeMetricFamily(metric, doc, labels=["model_name"])
            g.add_metric(name, float(value))
            yield g
        counters = (
            ("vllm:num_preemptions", "Preemptions by recompute.", eng.num_preemptions),
            ("vllm:prompt_tokens", "Prompt tokens prefilled.", eng.prompt_tokens_total),
            ("vllm:generation_tokens", "Tokens generated.", eng.generation_tokens_total),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in tokens: every admitted request's tokens, looked up.",
                eng.prefix_queries_tokens,
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", eng.prefix_hits_tokens),
        )
        for metric, doc, value in counters:
            c = CounterMetricFamily(metric, doc, labels=["model_name"])
            c.add_metric(name, float(value))
            yield c
        ok = CounterMetricFamily(
            "vllm:request_success", "Requests finished.", labels=["model_name", "finished_reason"]
        )
        ok.add_metric([self.model_name, "length"], float(eng.finished_total))
        yield ok
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "KV cache configuration.", labels=list(self.cache_labels)
        )
        info.add_metric(list(self.cache_labels.values()), 1.0)
        yield info
