"""``rate_limits``: what each tenant may send (``gateway.settings`` holds the rest of the one settings
object; ``gateway.rate_limits`` enforces it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TenantLimits(BaseModel):
    """One tenant's limits (unset: no limit of that kind)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Prompt and output tokens: a request's prompt is counted when it is admitted, its output when
    it ends. A request is refused while the minute's tokens are already at the limit (so the limit
    can be passed by the requests already running, never by new ones)."""
    concurrent: int | None = Field(default=None, ge=1)
    """Requests in the gateway at once (queued or running), across replicas."""

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.concurrent))


class LimitsFile(BaseModel):
    """What ``rate_limits.file`` holds (YAML): re-read when it changes, no restart."""

    model_config = ConfigDict(extra="forbid")

    api_keys: dict[str, str] | None = None
    """Key → tenant; when given it replaces the settings' ``api_keys``."""
    default: TenantLimits | None = None
    tenants: dict[str, TenantLimits] | None = None


class RateLimitSettings(BaseModel):
    """Per-tenant rate limits (``gateway.rate_limits``), shared by every replica through ``redis_url``
    (atomic counters in Redis: the fleet holds the limit, not each replica), each replica alone without
    it. Over a limit: ``429`` (``rate_limit_exceeded``) with ``Retry-After``."""

    model_config = ConfigDict(extra="forbid")

    default: TenantLimits = Field(default_factory=TenantLimits)
    """Limits of every tenant not named in ``tenants`` (none by default)."""
    tenants: dict[str, TenantLimits] = Field(default_factory=dict)
    file: str | None = None
    """A YAML file with ``api_keys``, ``default`` and ``tenants`` (each optional) overriding these;
    checked for changes at most every ``reload_s`` and applied to the next requests."""
    reload_s: float = Field(default=1.0, gt=0.0)
    redis_prefix: str = "sagegate:limits"
    lease_s: float = Field(default=30.0, gt=0.0)
    """A replica that stops renewing its lease (it died) stops counting against ``concurrent`` after
    this long."""
    timeout_s: float = Field(default=0.25, gt=0.0)
    """Redis must answer within this; else the replica enforces the limits alone until it does."""

    def limits_of(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.default)
