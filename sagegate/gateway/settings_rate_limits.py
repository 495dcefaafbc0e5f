"""``rate_limits``: what each tenant may send (``gateway.settings`` holds the rest of the one settings
object; ``gateway.rate_limits`` enforces it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_BAND = 1
"""The priority band of a request that names none (``core.request.DEFAULT_PRIORITY``)."""


class TenantLimits(BaseModel):
    """One tenant's limits (unset: no limit of that kind)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Prompt and output tokens. A request is charged its prompt and its output cap (``max_tokens``,
    else ``limits.max_tokens``) when it is admitted, and given back the output it did not use when it
    ends; it is refused unless its prompt fits what is left of the minute (a prompt over the whole
    limit: never). So no minute serves more than the limit plus one request's output cap."""
    concurrent: int | None = Field(default=None, ge=1)
    """Requests in the gateway at once (queued or running), across replicas."""
    max_priority: int = Field(default=DEFAULT_BAND, ge=-1_000_000, le=1_000_000)
    """The highest priority band this tenant's requests may claim (``x-priority``, or a body
    ``priority``): a higher claim is lowered to it (or refused: ``rate_limits.priority_over``), and
    only a band above it may pause this tenant's streams for another tenant. Without ``api_keys``
    the tenant is the client's own claim, so every client gets ``default``'s."""

    @property
    def limited(self) -> bool:
        """Whether a request of this tenant is counted (holds a permit)."""
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.concurrent))


class LimitsFile(BaseModel):
    """What ``rate_limits.file`` holds (YAML): re-read when it changes, no restart. Each section
    present replaces the setting it names; a section left empty (``api_keys:`` with nothing under
    it, as a half-written file has) is an error, not "none"."""

    model_config = ConfigDict(extra="forbid")

    api_keys: dict[str, str] | None = None
    """Key → tenant; when given it replaces the settings' ``api_keys``."""
    default: TenantLimits | None = None
    tenants: dict[str, TenantLimits] | None = None
    open: bool = False
    """True: this file may leave the gateway with no API key at all (anyone may call, as any
    tenant). Without it, a file that would remove the last key is refused and the keys stay."""

    @model_validator(mode="before")
    @classmethod
    def _no_empty_sections(cls, data: Any) -> Any:
        if isinstance(data, dict):
            empty = [k for k, v in data.items() if v is None]
            if empty:
                raise ValueError(f"{', '.join(map(str, empty))} left empty (write {{}} to mean none)")
        return data


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
    lease_s: float = Field(default=10.0, ge=1.0, le=300.0)
    """Each admitted request holds a lease on one of its tenant's ``concurrent`` places, renewed by
    its replica every third of this while it runs: a release that never comes (the replica died,
    Redis stalled) frees the place within this long."""
    timeout_s: float = Field(default=0.25, gt=0.0)
    """Redis must answer within this; else the replica enforces the limits alone until it does."""
    priority_over: Literal["clamp", "reject"] = "clamp"
    """A request claiming a band above its tenant's ``max_priority``: lowered to it (``clamp``), or
    refused with ``403`` (``reject``)."""
