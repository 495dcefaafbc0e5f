"""The gateway's one settings object: defaults, then a YAML file, then ``SAGEGATE_*`` environment
variables, then explicit overrides (the CLI's flags), later sources winning.

Nested fields use ``__`` in the environment: ``SAGEGATE_ADMISSION__TARGET=0.9``. Lists and mappings
are JSON there: ``SAGEGATE_BACKENDS='["http://a:8000","http://b:8000"]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from sagegate.gateway.access_log import AccessLogFormat
from sagegate.gateway.settings_kv_events import BackendKVEvents, KVEventsSettings
from sagegate.gateway.settings_limits import LimitSettings
from sagegate.gateway.settings_predictor import (
    DEFAULT_BUDGET_S,
    PREDICTORS,
    PredictorSettings,
    SemanticSettings,
    check_options,
    tag_options,
)
from sagegate.gateway.settings_profile import ProfileSettings
from sagegate.gateway.settings_rate_limits import RateLimitSettings
from sagegate.gateway.settings_share import ShareSettings
from sagegate.gateway.settings_tracing import TracingSettings
from sagegate.gateway.settings_upstream import UpstreamSettings
from sagegate.policies.admission import AdmissionConfig, Rule
from sagegate.policies.pause import PauseConfig

__all__ = [
    "DEFAULT_BUDGET_S",
    "PREDICTORS",
    "BackendKVEvents",
    "GatewaySettings",
    "KVEventsSettings",
    "LimitSettings",
    "PredictorSettings",
    "UpstreamSettings",
    "load_settings",
]


class BackendSettings(BaseModel):
    """One upstream engine. ``capacity_tokens`` overrides what its ``vllm:cache_config_info`` says."""

    url: str
    name: str | None = None
    capacity_tokens: int | None = Field(default=None, gt=0)
    kv_events: BackendKVEvents | None = None
    """Follow its KV-cache events (an endpoint string, or the mapping); unset: the approximate index."""
    api_key: SecretStr | None = None
    """The key the backend was started with (vLLM's ``--api-key``), sent as ``Authorization: Bearer`` on
    every request to it; unset: ``upstream.api_key``."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """Other headers sent on every request to it (what a proxy in front of the engine wants); never
    logged or shown."""

    @field_validator("kv_events", mode="before")
    @classmethod
    def _endpoint_only(cls, v: Any) -> Any:
        return {"endpoint": v} if isinstance(v, str) else v

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"backend url {v!r} must start with http:// or https://")
        return v


_ADMISSION = AdmissionConfig()

OpenEndpoint = Literal["metrics", "models", "openapi"]
OPEN_BY_DEFAULT: tuple[OpenEndpoint, ...] = ("metrics", "models", "openapi")


LIVE_MAX_WAITING_TOKENS = 8192


class AdmissionSettings(BaseModel):
    """The memory-aware admission rule's knobs (see ``policies.admission``; defaults are its own,
    tuned in the simulator, except ``max_waiting_tokens``, see below)."""

    quantile: float = Field(default=_ADMISSION.quantile, ge=0.0, le=1.0)
    target: float = Field(default=_ADMISSION.target, gt=0.0)
    max_waiting: int = Field(default=_ADMISSION.max_waiting, ge=1)
    unknown_output: int = Field(default=_ADMISSION.unknown_output, ge=1)
    rule: Rule = _ADMISSION.rule
    """"sum" or "peak" (see ``policies.admission.AdmissionConfig.rule``)."""
    peak_target: float = Field(default=_ADMISSION.peak_target, gt=0.0)
    max_waiting_tokens: int = Field(default=LIVE_MAX_WAITING_TOKENS, ge=1)
    """Live, a request counts as waiting until its first byte, prefill included, so the gateway's
    estimate of a backend's waiting tokens runs above the engine's own; a deeper backlog than the
    simulator's (2048) compensates. Measured at 2x overload (the runs are in docs/journal/BENCHMARKS.md,
    *The gateway*): 2048 cost 9-11% of throughput against vLLM alone, 8192 cost 2.6% with sagesched, and
    preemptions fell 56 -> 0."""
    prompt_share: bool = False
    """Charge a prompt at the share of its tokens the engines' KV gauges say prompts really hold
    (``policies.prompt_share``: prefix caching keeps one copy of a shared prefix). Off by default:
    whole prompts, as the simulator charges. Turn it on where most prompts share long prefixes (on
    prompts that all shared one prefix, whole-prompt charges cost fcfs 7% of vLLM alone's throughput);
    on unique prompts it can only read low, because a gateway slow to read finished streams counts
    prompts the engine has already freed (measured 0.55-0.88 on a CPU-starved machine). With
    cache-aware placement it is measured but not applied: the charge counts shared blocks once
    (``policies.resident``)."""
    band_reserve: float = Field(default=_ADMISSION.band_reserve, ge=0.0, lt=1.0)
    """Share of each backend's admission room kept for requests above the default priority band
    (``x-priority`` 2 and up): a flood in the default band cannot fill it (see
    ``policies.admission.AdmissionConfig.band_reserve``). 0, the default: none kept."""
    pending_s: float = Field(default=0.03, gt=0.0)
    """A request sent to a backend counts as waiting there until its first byte, the next scrape, or
    this long (about one engine step: by then the engine has scheduled it or reports it waiting)."""

    def config(self) -> AdmissionConfig:
        return AdmissionConfig(
            quantile=self.quantile,
            target=self.target,
            max_waiting=self.max_waiting,
            unknown_output=self.unknown_output,
            max_waiting_tokens=self.max_waiting_tokens,
            rule=self.rule,
            peak_target=self.peak_target,
            band_reserve=self.band_reserve,
        )


_PAUSE = PauseConfig()


class PauseSettings(BaseModel):
    """Gateway-level pause with transparent resume (``gateway.resume``, decided by ``policies.pause``):
    a streamed request is taken off its backend (its KV freed) and later continued from its text on any
    backend, the client seeing one unbroken answer. Pausing is off by default: the simulator found that
    pausing by rank does not pay on the workloads measured (RESULTS.md, "Pausing and engine-level
    preemption"). Resuming a stream its backend broke is on: it uses the same mechanism."""

    enabled: bool = False
    """Pausing: ``POST /admin/requests/{id}/pause`` works, and (``by_policy``) the dispatch pass pauses
    by rank. A non-streamed request the gateway may pause goes upstream as a stream."""
    resume_broken: bool = True
    """A streamed answer whose backend dies or cuts the connection mid-way is continued on another
    backend from the text the client has (it counts as a pause, within ``max_pauses``), instead of
    ending with an error event. Costs a transcript per streamed request: its events are kept (up to
    64 KiB) and folded into text past that (RESULTS.md, *What the gateway costs*). A non-streamed
    request needs none: it has sent nothing when its backend fails, and is retried whole."""
    by_policy: bool = True
    """With ``enabled``: the dispatch pass also pauses a running request whose Gittins rank fell behind
    a waiting head that no backend admits, when the expected gain beats ``hysteresis`` × the resume's
    prefill. False: only operators and failed backends pause."""
    bands: bool = _PAUSE.bands
    """Whether ``enabled`` or not: a waiting request of a higher priority band that no backend admits
    pauses a running streamed request of a lower band without which it fits (the lowest band, least
    held, first; ``policies.pause``), so a low band's flood cannot hold a high band back. With every
    request in one band it never happens."""
    max_pauses: int = Field(default=_PAUSE.max_pauses, ge=0, le=16)
    """At most this many pauses per request (no thrash); past it a request runs to its end."""
    hysteresis: float = Field(default=_PAUSE.hysteresis, ge=0.0)
    prefill_tokens_per_step: float = Field(default=_PAUSE.prefill_tokens_per_step, gt=0.0)
    """The resume cost's exchange rate: prefill tokens one decode step of engine time buys."""

    def config(self) -> PauseConfig:
        """What the dispatch loop decides with (its ``enabled``: pausing by rank)."""
        return PauseConfig(
            enabled=self.enabled and self.by_policy,
            max_pauses=self.max_pauses,
            hysteresis=self.hysteresis,
            prefill_tokens_per_step=self.prefill_tokens_per_step,
            bands=self.bands,
        )


class LedgerSettings(BaseModel):
    """The admission ledger several gateway replicas share in Redis (``gateway.ledger``). On whenever
    ``redis_url`` is set, unless ``enabled`` is false: replicas started with one Redis URL then share
    every backend's KV instead of each admitting into all of it. Off, each replica owns every
    backend's whole KV (a replica alone saves Redis's round trip before each dispatch)."""

    enabled: bool | None = None
    """None (default): on with ``redis_url``; true needs ``redis_url``; false: off."""
    lease_s: float = Field(default=2.0, gt=0.0)
    """A replica's charges live this long in Redis after its last renewal: a replica that dies (or
    loses Redis) has its charges forgotten by the others within ``lease_s`` (plus one sync)."""
    sync_interval_s: float = Field(default=0.05, gt=0.0)
    """How often a replica publishes its charges' progress, renews its lease and reads the others'
    charges into its local view. Must be well under ``lease_s``."""
    publish_s: float = Field(default=0.01, gt=0.0)
    """How soon, between syncs, a replica publishes what the others must not wait a sync for, and
    reads what they announced: a charge that grew (its request ran past its predicted length: Redis
    checks every commit against the charges as last published, so an unpublished growth is room
    granted twice; 1.41x one gateway's preemptions when growth waited for the 50 ms sync), a release
    (announced on ``{prefix}:freed``), and another replica's release (room that a better head here
    may take; 0.98x one gateway's throughput when it waited for the sync, 1.009x read at once). At
    most one such call per interval; at most ``sync_interval_s``."""
    local_share: float = Field(default=0.5, gt=0.0, le=1.0)
    """With Redis unreachable, the share of every backend's KV capacity this replica admits into on
    its own (set it to 1 / the number of replicas so that together they never exceed a backend)."""
    timeout_s: float = Field(default=0.25, gt=0.0)
    """A Redis call slower than this counts as Redis down (local ledgers until it answers again)."""
    prefix: str = "sagegate:ledger"
    """Key prefix in Redis: replicas in front of one fleet share it."""
    send_first_share: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Send first, commit after: a dispatch the local view admits goes to its backend at once (its
    charge rides the next call, which reports whether the fleet's charges there then exceed the
    rule's limit) while this replica's charges on that backend that Redis has not yet seen stay within
    ``send_first_share × capacity / live replicas``; beyond that budget a dispatch waits for Redis's
    verdict as with 0 (every dispatch waits). With a fixed set of replicas the room granted twice
    is at most ``send_first_share`` of a backend's capacity; joins and Redis restarts widen it for a
    sync (docs/gateway.md, *Send first*)."""
    order: Literal["none", "threshold"] = "threshold"
    """``threshold`` (default): each sync also publishes this replica's queue head and reads the
    others'; a head ranked worse than another replica's is held while dispatching it would leave that
    better head no room (``policies.rank_threshold``). ``none``: each replica orders only its own
    queue, and room freed by a replica's request goes to that replica's head first (it sees the
    release at once, the others one sync later): measured live, a replica whose own requests had all
    ended was locked out while the others refilled the room (3 replicas at 2x overload: 0.90x one
    gateway's throughput with ``none``, 1.005x with ``threshold``; docs/journal/BENCHMARKS.md,
    *Several replicas, one admission ledger*)."""

    @model_validator(mode="after")
    def _sync_within_lease(self) -> LedgerSettings:
        if self.sync_interval_s * 2 > self.lease_s:
            raise ValueError("ledger.sync_interval_s must be at most half of ledger.lease_s")
        if self.publish_s > self.sync_interval_s:
            raise ValueError("ledger.publish_s must be at most ledger.sync_interval_s")
        return self


class QueueSettings(BaseModel):
    """Bounds on the gateway's own queue."""

    max_requests: int = Field(default=10_000, ge=1)
    max_tokens: int = Field(default=50_000_000, ge=1)
    """Sum of queued requests' prompt tokens."""
    max_wait_s: float = Field(default=60.0, gt=0.0)
    """A request still queued after this long is answered 429 (backends busy) or 503 (none healthy)."""
    aged_share: float = Field(default=0.5, ge=0.0, lt=1.0)
    """The starvation bound: a policy with a ``max_wait_s`` parameter (``sagesched``) whose spec does
    not set one gets ``max_wait_s = aged_share × queue.max_wait_s``, so a request that has waited
    that long goes ahead of every one that has not (oldest first) and has the rest of the queue's
    limit to be served. Without it, under sustained overload the largest prompts wait until the
    queue's limit rejects them. 0 turns it off (also ``policy: "sagesched:max_wait_s=none"``)."""
    retry_after_s: int = Field(default=1, ge=0)


class PlacementSettings(BaseModel):
    """Where a dispatched request goes (``policies.placement``, ``gateway.locality``)."""

    mode: Literal["cache_aware", "least_loaded"] = "cache_aware"
    """``cache_aware``: weigh each backend's predicted cached prefix of the prompt against the work
    queued there; with no hit anywhere this is ``least_loaded``: the backend with the most room."""
    block_tokens: int = Field(default=64, ge=1, le=4096)
    """Tokens per block of the gateway's prefix index (about 4 characters a token). Larger blocks cost
    less CPU per request and predict hits up to one block short."""
    session_header: str = "x-session-id"
    """A client's session id: its next turn is credited, on its last turn's backend, with that prompt."""
    max_sessions: int = Field(default=100_000, ge=1)
    """Sessions remembered at most (least recently seen dropped first); each is kept as a 16-byte
    digest of its id, about 200 bytes with its entry, whatever the id's length."""
    max_session_id_bytes: int = Field(default=256, ge=1, le=8192)
    """A longer session id is refused (400, ``param`` the header's name)."""
    kv_events: KVEventsSettings = Field(default_factory=KVEventsSettings)
    """Following the KV-cache events of the backends that publish them (precise placement)."""
    share: ShareSettings = Field(default_factory=ShareSettings)
    """Replicas (``redis_url``) share the index through Redis (``gateway.shared_prefixes``)."""
    profile: ProfileSettings = Field(default_factory=ProfileSettings)
    """The placement plugins: scorers with weights and a picker (``gateway.settings_profile``)."""


class HealthSettings(BaseModel):
    """Health probing, metrics scraping and the circuit breaker."""

    scrape_interval_s: float = Field(default=0.1, gt=0.0)
    """How often each backend's ``/metrics`` is read (waiting requests, KV capacity). Between scrapes a
    request sent to a backend counts as waiting there until its first byte or ``admission.pending_s``."""
    probe_interval_s: float = Field(default=1.0, gt=0.0)
    """How often each backend's ``/health`` is probed."""
    probe_timeout_s: float = Field(default=2.0, gt=0.0)
    failure_threshold: int = Field(default=3, ge=1)
    """Consecutive failures (requests or probes) that open a backend's circuit."""
    open_s: float = Field(default=2.0, ge=0.0)
    """An open circuit stays open at least this long, then closes on the next successful probe."""


class GatewaySettings(BaseSettings):
    """Everything ``sagegate serve`` reads. See docs/gateway.md for each field."""

    model_config = SettingsConfigDict(
        env_prefix="SAGEGATE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    backends: list[BackendSettings] = Field(default_factory=list)
    policy: str = "sagesched"
    """A policy spec from the registry, e.g. ``sagesched``, ``fcfs``, ``edf``, ``fastserve:levels=4``."""
    predictor: str = "prefix"
    """``prefix`` (the default: outcomes per prompt prefix shrunk toward the global histogram; on
    the headroom map in RESULTS.md never worse than ``global`` on average in any cell, better where
    output length follows the task a system prompt names), ``global`` (one histogram), ``none``
    (prompt length only), ``length-bucket`` or ``semantic`` (similar past prompts: no better than
    ``global`` on the map, at several times its CPU)."""
    redis_url: str | None = None
    """Shared prediction history (every predictor but ``none``; in-process when unset), and the
    shared admission ledger's Redis (``ledger.enabled``)."""
    predictor_options: PredictorSettings = Field(default_factory=SemanticSettings)
    """The options of the predictor ``predictor`` names, and only its
    (``SAGEGATE_PREDICTOR_OPTIONS='{"predict_budget_s": 0.1}'`` or
    ``SAGEGATE_PREDICTOR_OPTIONS__PREDICT_BUDGET_S=0.1``); unset ones keep its defaults."""
    dispatch_first: bool = True
    """When nothing waits in the queue, a request does not wait for its prediction (the embedding,
    up to ``predict_budget_s``): it goes on the prompt-length prior, since no order is at stake, and the
    prediction, when it comes, recharges it where it runs (``sagegate_late_predictions_total
    {outcome="rebased"}``) or ranks it again if it had to queue. Off: every request waits for it."""
    cap_at_max_tokens: bool = True
    """Cap each predicted distribution at the request's ``max_tokens`` (its mass beyond moves onto the
    cap): a client that sets a tight cap gets the shorter rank it asked for. Off, the gateway ranks by
    the prediction alone; turn it off to benchmark with a client that sends ``max_tokens`` = the true
    output length (aiperf, guidellm, ``vllm bench serve``), which would otherwise hand it the answer."""
    tokenizer: str = "cl100k_base"
    """Encoding used to count prompt tokens (``bpe-openai``); ``chars`` = characters / 4."""
    default_capacity_tokens: int = Field(default=65_536, gt=0)
    """KV capacity assumed for a backend that neither reports nor is configured with one."""
    capacity_requests_per_backend: int = Field(default=256, ge=1)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    pause: PauseSettings = Field(default_factory=PauseSettings)
    """Pause running requests for better-ranked waiting work (off; docs/gateway.md)."""
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    """A shared admission ledger across replicas (needs ``redis_url``; see docs/gateway.md)."""
    queue: QueueSettings = Field(default_factory=QueueSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings)
    """Per-tenant requests and tokens per minute and requests at once (``gateway.rate_limits``),
    shared by the replicas through ``redis_url``."""
    api_keys: dict[str, str] = Field(default_factory=dict)
    """API key → tenant. Empty: no authentication, tenant from ``x-tenant``."""
    admin_key: str | None = None
    """Bearer key for ``/admin/*``; admin routes are closed when unset."""
    open_endpoints: list[OpenEndpoint] = Field(default_factory=lambda: list(OPEN_BY_DEFAULT))
    """With ``api_keys`` set, the read-only endpoints that still answer without a key: ``metrics``
    (``/metrics``, for Prometheus), ``models`` (``/v1/models``), ``openapi`` (``/openapi.json``).
    The others need a client's key or the admin key (401 otherwise). ``/health`` and ``/ready``
    always answer (load balancers probe them); generation always needs a key."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins browsers may call the gateway from (``["*"]`` for any); empty: no CORS headers."""
    log_prompts: bool = False
    """Log each prompt (at INFO, apart from the access log, which never holds one)."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry traces, one per request with its phases as child spans (``gateway.tracing``)."""
    access_log: AccessLogFormat = "text"
    """One line per generation request on the ``sagegate.access`` logger (``gateway.access_log``):
    its id, tenant, model, backend, status and outcome, tokens (prompt, predicted cached, output,
    predicted), queue wait, TTFT and TTLT from its arrival, retries and resumes. ``json`` for one
    object a line, ``off`` for none."""
    drain_timeout_s: float = Field(default=30.0, ge=0.0)
    """On SIGTERM, how long in-flight and queued requests may take to finish. Then the gateway ends
    what is left itself (streams with an SSE error event, the rest with ``503``)."""
    log_level: str = "info"

    @field_validator("backends", mode="before")
    @classmethod
    def _backend_strings(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [s for s in v.split(",") if s.strip()]
        if isinstance(v, list):
            return [{"url": b} if isinstance(b, str) else b for b in v]
        return v

    @field_validator("predictor")
    @classmethod
    def _known_predictor(cls, v: str) -> str:
        if v not in PREDICTORS:
            raise ValueError(f"unknown predictor {v!r}; valid: {', '.join(PREDICTORS)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _options_of_the_predictor(cls, data: Any) -> Any:
        return tag_options(data, cls.model_fields["predictor"].default)

    @model_validator(mode="after")
    def _options_fit_the_predictor(self) -> GatewaySettings:
        check_options(self.predictor, self.predictor_options)
        return self

    @model_validator(mode="after")
    def _ledger_needs_redis(self) -> GatewaySettings:
        if self.ledger.enabled and not self.redis_url:
            raise ValueError("ledger.enabled needs redis_url")
        return self

    @property
    def ledger_on(self) -> bool:
        """Whether this gateway shares the admission ledger (``ledger.enabled``, on with ``redis_url``)."""
        return bool(self.redis_url) and self.ledger.enabled is not False

    @model_validator(mode="after")
    def _named_backends(self) -> GatewaySettings:
        seen: set[str] = set()
        for i, b in enumerate(self.backends):
            if b.name is None:
                b.name = f"backend-{i}"
            if b.name in seen:
                raise ValueError(f"backend name {b.name!r} used twice")
            seen.add(b.name)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = settings_cls.model_config.get("yaml_file")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


def load_settings(config: str | Path | None = None, **overrides: Any) -> GatewaySettings:
    """Settings from ``config`` (YAML) and the environment; ``overrides`` that are not None win."""
    given = {k: v for k, v in overrides.items() if v is not None and v != []}
    if config is None:
        return GatewaySettings(**given)
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    cls = type(
        "GatewaySettingsFromFile",
        (GatewaySettings,),
        {"model_config": SettingsConfigDict(**{**GatewaySettings.model_config, "yaml_file": str(path)})},
    )
    return cls(**given)
