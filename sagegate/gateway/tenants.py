"""Who is asking, and what they asked for: API keys → tenants, request classes and deadlines.

Keys are compared in constant time (``hmac.compare_digest``) against every configured key, so the time
taken says nothing about which key, or how much of one, matched.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sagegate.gateway.errors import GatewayError, bad_request, unauthorized

TENANT_HEADER = "x-tenant"
PRIORITY_HEADER = "x-priority"
DEADLINE_HEADER = "x-deadline-ms"
SLO_TTFT_HEADER = "x-slo-ttft-ms"
MAX_TENANT_LEN = 128
PRIORITY_BOUND = 1_000_000
"""A band is an integer in ``[-PRIORITY_BOUND, PRIORITY_BOUND]`` (``x-priority`` or the body's)."""
_INTEGER = re.compile(r"-?[0-9]{1,10}")
"""What an integer header may be: an optional minus and digits (no ``+7``, ``1_000``, spaces)."""


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    priority: int
    deadline_s: float | None
    """Absolute, on the gateway's clock."""
    band_ceiling: int | None = None
    """The highest band the tenant may claim (set once the limits are read); None: unbounded."""


def bearer(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


def match_key(given: str | None, keys: Mapping[str, str]) -> str | None:
    """The tenant of ``given`` among ``keys`` (key → tenant), or None. Checks every key."""
    if given is None:
        return None
    found = None
    raw = given.encode()
    for key, tenant in keys.items():
        if hmac.compare_digest(raw, key.encode()):
            found = tenant
    return found


def is_admin(headers: Mapping[str, str], admin_key: str | None) -> bool:
    given = bearer(headers)
    if admin_key is None or given is None:
        return False
    return hmac.compare_digest(given.encode(), admin_key.encode())


def identify(
    headers: Mapping[str, str], keys: Mapping[str, str], now: float, body_priority: object = None
) -> Identity:
    """Tenant, priority and deadline of a request; raises :class:`GatewayError` (401 or 400).

    The priority (its band: higher served first) is ``x-priority``, else the body's ``priority`` read
    as vLLM reads it (lower first: ``priority`` p is band 1 − p, so vLLM's default 0 is the gateway's
    default band 1), else 1."""
    if keys:
        tenant = match_key(bearer(headers), keys)
        if tenant is None:
            raise unauthorized()
    else:
        tenant = headers.get(TENANT_HEADER) or "default"
        if len(tenant) > MAX_TENANT_LEN:
            raise bad_request(f"{TENANT_HEADER} longer than {MAX_TENANT_LEN} characters", TENANT_HEADER)
    priority = _int_header(headers, PRIORITY_HEADER, 1, lo=-PRIORITY_BOUND, hi=PRIORITY_BOUND)
    if PRIORITY_HEADER not in headers and body_priority is not None:
        if isinstance(body_priority, bool) or not isinstance(body_priority, int):
            raise bad_request("priority must be an integer", "priority")
        if not -PRIORITY_BOUND < body_priority <= PRIORITY_BOUND:
            raise bad_request(
                f"priority must be between {1 - PRIORITY_BOUND} and {PRIORITY_BOUND}", "priority"
            )
        priority = 1 - body_priority
    deadline = None
    for name in (DEADLINE_HEADER, SLO_TTFT_HEADER):
        if name in headers:
            ms = _int_header(headers, name, 0, lo=0, hi=86_400_000)
            deadline = now + ms / 1000.0
            break
    return Identity(tenant, priority, deadline)


def _int_header(headers: Mapping[str, str], name: str, default: int, *, lo: int, hi: int) -> int:
    raw = headers.get(name)
    if raw is None:
        return default
    if _INTEGER.fullmatch(raw) is None:
        raise bad_request(f"header {name} must be an integer (digits, an optional minus)", name)
    value = int(raw)
    if not lo <= value <= hi:
        raise bad_request(f"header {name} must be between {lo} and {hi}", name)
    return value


__all__ = ["GatewayError", "Identity", "bearer", "identify", "is_admin", "match_key"]
