"""The gateway's Prometheus metrics, in a registry of its own (several gateways may share a process).

Counters and histograms are updated as things happen; gauges of state (queue depth, per-backend
in-flight and reserved KV tokens, health) are read from the live objects when scraped, so keeping
them costs nothing per request.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.telemetry import Telemetry
from sagegate.policies.forecast_report import WINDOW, ForecastReport, Judged
from sagegate.policies.placement.outcome import Forecasted

log = logging.getLogger("sagegate.gateway")

LOG_EVERY_S = 1.0
"""Refusals are logged at most once a second per reason (the counter has them all)."""

TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, float("inf"))
WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf"))
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, float("inf"))
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, float("inf"))
RATIO_BUCKETS = (0.125, 0.25, 0.5, 0.8, 1.0, 1.25, 2, 4, 8, float("inf"))
ERROR_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, float("inf"))


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "sagegate_requests", "Requests answered, by route and status.", ["route", "status"], registry=r
        )
        self.admissions = Counter(
            "sagegate_admissions", "Requests dispatched to a backend.", ["backend"], registry=r
        )
        self.rejections = Counter(
            "sagegate_rejections", "Requests refused or dropped, by reason.", ["reason"], registry=r
        )
        self.retries = Counter(
            "sagegate_retries", "Requests retried on another backend.", ["backend"], registry=r
        )
        self.suspect_failures = Counter(
            "sagegate_suspect_failures",
            "Tries that failed in a way the request may have caused (a 5xx, dropped before the first "
            "byte), by verdict: backend (charged to its breaker), this_input (another request was "
            "answered there meanwhile: not charged), request (it failed on two backends: not charged), "
            "none (no other try: not charged).",
            ["verdict"],
            registry=r,
        )
        self.placements = Counter(
            "sagegate_placements",
            "Dispatches by how the prefix cache placed them: sticky (where most of the prompt is "
            "predicted cached), broke_away (another backend holds more, but waiting there costs more), "
            "no_hit (cached nowhere).",
            ["kind"],
            registry=r,
        )
        self.prefix_tokens = Counter(
            "sagegate_prefix_tokens",
            "Prompt tokens dispatched to each backend (what=sent) and of those predicted cached there "
            "(what=predicted_cached); the backend's own vllm:prefix_cache_hits/queries say what it found.",
            ["backend", "what"],
            registry=r,
        )
        self.cancellations = Counter(
            "sagegate_cancellations", "Requests whose client went away, by stage.", ["stage"], registry=r
        )
        self.pauses = Counter(
            "sagegate_pauses", "Requests paused at the gateway, and how their resumes went.", ["event"],
            registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "sagegate_queue_wait_seconds", "Time from enqueue to dispatch.", buckets=WAIT_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "sagegate_ttft_seconds", "Time from arrival to the first byte from the backend.",
            buckets=WAIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "sagegate_e2e_seconds", "Time from arrival to the last token, requests that completed.",
            buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "sagegate_time_per_output_token_seconds",
            "(last token − first token) / (output tokens − 1), requests that completed with two or more.",
            buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self.tenant_tokens = Counter(
            "sagegate_tenant_tokens",
            "Prompt and output tokens of requests that ended, by tenant (a tenant not named in api_keys "
            "or rate_limits counts as other).", ["tenant", "kind"], registry=r,
        )  # fmt: skip
        self.predicted = Histogram(
            "sagegate_predicted_output_tokens", "Predicted mean output length.", buckets=TOKEN_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.actual = Histogram(
            "sagegate_actual_output_tokens", "True output length.", buckets=TOKEN_BUCKETS, registry=r
        )
        self.ratio = Histogram(
            "sagegate_output_actual_over_predicted", "True output length over the predicted mean.",
            buckets=RATIO_BUCKETS, registry=r,
        )  # fmt: skip
        self._rejection_log = RateLimitedLog(log, "rejected %d request(s): %s")
        self.connections_closed = Counter(
            "sagegate_client_connections_closed",
            "Client connections the gateway closed or lost, by why: idle (past limits.keep_alive_s), "
            "lost_mid_request (closed by the client's side with a request unanswered), head_timeout, "
            "head_too_large.",
            ["why"],
            registry=r,
        )
        self._connection_log = RateLimitedLog(
            log, "client connection(s) closed or lost: %d x %s", level=logging.INFO
        )
        self.predictor_paths = Counter(
            "sagegate_predictor_path", "Predictions by the path the predictor took.", ["path"], registry=r
        )
        self.late_predictions = Counter(
            "sagegate_late_predictions",
            "Predictions that missed their budget (or were not waited for: dispatch_first), by what "
            "became of them when they came: reranked (still queued), rebased (running: recharged), "
            "dispatched (gone, or unused), failed.",
            ["outcome"],
            registry=r,
        )
        self.ledger_wait = Histogram(
            "sagegate_ledger_commit_wait_seconds",
            "Shared ledger: from a dispatch decision to Redis's answer (the wait before a request is "
            "sent), by answer.",
            ["answer"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.ledger_sent_first = Counter(
            "sagegate_ledger_sent_first",
            "Shared ledger: dispatches sent before Redis saw their charge (ledger.send_first_share).",
            registry=r,
        )
        self.ledger_over = Counter(
            "sagegate_ledger_over",
            "Shared ledger: calls that found a backend, where this replica had sent first, over the "
            "admission rule's limit (room granted twice), by backend.",
            ["backend"],
            registry=r,
        )
        self.telemetry = Telemetry(r)
        self.forecasts = ForecastReport()
        """The placement's forecasts beside the outcomes (``policies.forecast_report``)."""
        self.forecast_error = Histogram(
            "sagegate_forecast_error_ratio",
            "|forecast − outcome| / outcome of a completed request's first token (ttft) and last token "
            "(ttlt), from when it was sent, the forecast scaled by its backend's learned factor.",
            ["what"], buckets=ERROR_BUCKETS, registry=r,
        )  # fmt: skip
        r.register(_StateCollector(self._forecast_medians))
        """The recent history the dashboard shows (fed by :meth:`first_token` and :meth:`outcome`)."""

    def dispatched(self, backend: str, wait_s: float) -> None:
        self.admissions.labels(backend).inc()
        self.queue_wait.observe(wait_s)

    def rejected(self, reason: str) -> None:
        """Count a refusal and log it (WARNING; at most one line per reason per ``LOG_EVERY_S``, with
        how many the line stands for, so a flood of refusals cannot flood the log)."""
        self.rejections.labels(reason).inc()
        self._rejection_log.note(reason)

    def placed(self, backend: str, kind: str, prompt_tokens: int, cached: int) -> None:
        """A dispatch placed by ``gateway.locality``."""
        self.placements.labels(kind).inc()
        self.prefix_tokens.labels(backend, "sent").inc(prompt_tokens)
        self.prefix_tokens.labels(backend, "predicted_cached").inc(cached)

    def connection_event(self, why: str) -> None:
        """A client connection closed by the gateway or lost (``gateway.client_guard``): counted, and
        logged at INFO (rate-limited) but for idle ones, which a keep-alive closes as a matter of course."""
        self.connections_closed.labels(why).inc()
        if why != "idle":
            self._connection_log.note(why)

    def first_token(self, ttft_s: float) -> None:
        """The backend's first byte, ``ttft_s`` after the request arrived."""
        self.ttft.observe(ttft_s)
        self.telemetry.first_token(ttft_s)

    def outcome(
        self, prediction: LengthDistribution | None, actual: int, ttlt_s: float, ttft_s: float | None = None
    ) -> None:
        """A request completed with ``actual`` tokens, ``ttlt_s`` after it arrived (its first token
        ``ttft_s`` after)."""
        self.actual.observe(actual)
        self.e2e.observe(ttlt_s)
        if ttft_s is not None and actual > 1:
            self.tpot.observe(max(0.0, ttlt_s - ttft_s) / (actual - 1))
        if prediction is not None and prediction.mean > 0:
            self.ratio.observe(actual / prediction.mean)
        self.telemetry.completed(ttlt_s, prediction, actual)

    def forecast(self, backend: str, forecast: Forecasted, ttft_s: float | None, ttlt_s: float) -> Judged:
        """A completed request's forecast judged against its times from when it was sent."""
        judged = self.forecasts.judge(backend, forecast, ttft_s, ttlt_s)
        if judged.ttft_error is not None:
            self.forecast_error.labels("ttft").observe(judged.ttft_error)
        if judged.ttlt_error is not None:
            self.forecast_error.labels("ttlt").observe(judged.ttlt_error)
        return judged

    def _forecast_medians(self) -> list[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "sagegate_forecast_median_error",
            f"Median |forecast − outcome| / outcome over the latest {WINDOW} completed requests.",
            labels=["what"],
        )
        for what, value in self.forecasts.median_errors().items():
            if value is not None:
                gauge.add_metric([what], value)
        return [gauge]

    def attach_state(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Gauges (or counters kept elsewhere) computed at scrape time by ``read``."""
        self.registry.register(_StateCollector(read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RateLimitedLog:
    """One line (WARNING unless ``level``) per key at most every ``every_s``: the first occurrence at
    once, the ones after it summed into the next line (written when the next occurrence comes after
    the interval)."""

    def __init__(
        self,
        logger: logging.Logger,
        fmt: str,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.logger = logger
        self.fmt = fmt
        self.level = level
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def note(self, key: str) -> None:
        now = self.clock()
        held = self._held.get(key, 0) + 1
        if now - self._last.get(key, -math.inf) < self.every_s:
            self._held[key] = held
            return
        self._last[key] = now
        self._held[key] = 0
        self.logger.log(self.level, self.fmt, held, key)


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        return self.read()

    def describe(self) -> Iterable[Metric]:
        return []
