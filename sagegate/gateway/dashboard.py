"""The live dashboard: one static page and the same-origin JSON feed it polls.

``GET /dashboard`` serves the page (static files in ``gateway/static``, no build step, no library);
``GET /admin/dashboard`` is its feed: the admin queue snapshot plus, per backend, the engine's own KV
gauge beside the admission rule's projected peak and limit, the timeline of the last minutes and the
prediction quality of recent completions. Both need the admin key: as a bearer token, or once as
``/dashboard?key=…``, which sets an HttpOnly cookie holding a token derived from the key (never the
key itself) and redirects to a URL without it.

Cost: the feed is built at most once per ``FEED_TTL_S`` however many pages poll, the timeline is
sampled by one background task per ``STEP_S``, and nothing in the request path waits for either.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from sagegate.gateway.backends import BackendPool
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.errors import GatewayError
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.telemetry import STEP_S
from sagegate.gateway.tenants import is_admin
from sagegate.policies.admission import AdmissionConfig
from sagegate.policies.dispatch_loop import Decision, DecisionKind

log = logging.getLogger("sagegate.gateway")

FEED_TTL_S = 0.5
"""A feed younger than this is served again as it is: any number of open pages cost one build."""
QUEUE_ROWS = 50
"""Waiting requests the feed lists (best-ranked first); the depth counts them all."""
COOKIE = "sagegate_dashboard"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


class Snapshotting(Protocol):
    """What the feed reads from the gateway (``gateway.app.Gateway``)."""

    metrics: GatewayMetrics
    pool: BackendPool
    dispatcher: Dispatcher

    def queue_snapshot(self, limit: int) -> dict[str, Any]: ...


def cookie_token(admin_key: str) -> str:
    """What the cookie holds: a MAC of a fixed label under the admin key (the key never leaves)."""
    return hmac.new(admin_key.encode(), b"sagegate-dashboard", hashlib.sha256).hexdigest()


def authorised(request: Request, admin_key: str | None) -> bool:
    if is_admin(request.headers, admin_key):
        return True
    given = request.cookies.get(COOKIE)
    return admin_key is not None and given is not None and hmac.compare_digest(given, cookie_token(admin_key))


def forbidden() -> GatewayError:
    return GatewayError(
        403,
        "admin key required: send it as a bearer token, or open /dashboard?key=<admin key> once",
        type="authentication_error",
        reason="forbidden",
    )


def backend_view(pool: BackendPool, cfg: AdmissionConfig) -> list[dict[str, Any]]:
    """Per backend: the engine's KV gauge (scraped) beside what the admission rule projects."""
    target = cfg.peak_target if cfg.rule == "peak" else cfg.target
    out = []
    for b in pool.backends:
        load = b.load
        peak = load.holdings.peak() if cfg.rule == "peak" else load.charged_tokens
        out.append(
            {
                "name": b.name,
                "kv_used_tokens": None if b.kv_usage is None else b.kv_usage * load.capacity_tokens,
                "projected_peak_tokens": peak,
                "limit_tokens": target * load.capacity_tokens,
                "running": load.running,
            }
        )
    return out


HOLD_TEXT = {
    DecisionKind.NO_ROOM: "its charge fits under no backend's admission limit",
    DecisionKind.HOLD: "the policy holds it",
    DecisionKind.NO_HEALTHY_BACKEND: "no backend is healthy",
}
WAITING_FULL = (
    "a backend has KV room for it but its waiting list is full (admission.max_waiting / max_waiting_tokens)"
)


def head_view(
    stop: Decision[Any] | None, head_id: object, pool: BackendPool, cfg: AdmissionConfig
) -> dict[str, Any] | None:
    """Why the head waits: the last pass's stopping decision, if it was about today's head."""
    if stop is None or stop.request.rid != head_id or stop.kind not in HOLD_TEXT:
        return None
    why = HOLD_TEXT[stop.kind]
    if stop.kind is DecisionKind.NO_ROOM and any(
        b.healthy and b.load.admits(stop.charge, cfg) for b in pool.backends
    ):
        why = WAITING_FULL
    why += f": {stop.reason}" if stop.reason else ""
    return {
        "id": stop.request.rid,
        "kind": str(stop.kind),
        "charge_tokens": stop.charge.value,
        "backend": stop.backend,
        "reason": f"{why} (charge {stop.charge.value:,.0f} tokens)",
    }


def build_feed(gw: Snapshotting, cfg: AdmissionConfig, now: float) -> dict[str, Any]:
    """One consistent picture: the admin snapshot and everything the page draws, read at ``now``."""
    snap = gw.queue_snapshot(QUEUE_ROWS)
    extra = {row["name"]: row for row in backend_view(gw.pool, cfg)}
    for b in snap["backends"]:
        b.update(extra.get(b["name"], {}))
    telemetry = gw.metrics.telemetry
    head_id = snap["requests"][0]["id"] if snap["requests"] else None
    return {
        "t": now,
        **snap,
        "head": head_view(gw.dispatcher.last_stop, head_id, gw.pool, cfg),
        "admission": {"rule": cfg.rule, "target": cfg.peak_target if cfg.rule == "peak" else cfg.target},
        "series": telemetry.series(),
        "quality": telemetry.quality(now),
    }


class FeedCache:
    """The last feed, rebuilt when older than ``ttl_s``."""

    def __init__(
        self, build: Callable[[float], dict[str, Any]], clock: Callable[[], float], ttl_s: float
    ) -> None:
        self.build, self.clock, self.ttl_s = build, clock, ttl_s
        self._at = float("-inf")
        self._feed: dict[str, Any] = {}
        self._body = b"{}"
        self.builds = 0

    def get(self) -> dict[str, Any]:
        self._refresh()
        return self._feed

    def body(self) -> bytes:
        """The feed as JSON, encoded once per build (FastAPI's encoder would walk it on every poll)."""
        self._refresh()
        return self._body

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._at < self.ttl_s:
            return
        t0 = time.perf_counter()
        feed = self.build(now)
        body = encode(feed)
        feed["build_ms"] = 1000 * (time.perf_counter() - t0)  # what the page cost the gateway
        self._feed, self._at = feed, now
        self._body = body[:-1].encode() + f',"build_ms":{feed["build_ms"]:.3f}}}'.encode()
        self.builds += 1


async def run_sampler(
    gw: Snapshotting, queue_depth: Callable[[], int], clock: Callable[[], float], step_s: float = STEP_S
) -> None:
    """Close a timeline step every ``step_s`` until cancelled (a failure skips one step, never ends it)."""
    while True:
        await asyncio.sleep(step_s)
        try:
            gw.metrics.telemetry.sample(clock(), queue_depth())
        except Exception:
            log.exception("dashboard sampler failed a step")


class Sampler:
    """The background task behind :func:`run_sampler`, started and stopped with the gateway."""

    def __init__(self, gw: Snapshotting, queue_depth: Callable[[], int], clock: Callable[[], float]) -> None:
        self.gw, self.queue_depth, self.clock = gw, queue_depth, clock
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(run_sampler(self.gw, self.queue_depth, self.clock))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def encode(feed: dict[str, Any]) -> str:
    """Strict JSON (a browser's ``JSON.parse`` rejects NaN): a non-finite number becomes null."""
    try:
        return json.dumps(feed, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(feed), separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _asset(name: str) -> bytes:
    return resources.files("sagegate.gateway").joinpath("static", name).read_bytes()


def dashboard_router(
    feed: FeedCache, admin_key: Callable[[], str | None], pages: Mapping[str, bytes] | None = None
) -> APIRouter:
    """The page, its two assets and the feed, each behind the admin key."""
    router = APIRouter()
    files = dict(pages) if pages is not None else {n: _asset(n) for n in ("dashboard.html", *ASSETS)}

    @router.get("/dashboard", include_in_schema=False)
    async def page(request: Request, key: str | None = None) -> Response:
        admin = admin_key()
        if key is not None:
            if admin is None or not hmac.compare_digest(key.encode(), admin.encode()):
                raise forbidden()
            resp = RedirectResponse("/dashboard", status_code=303)
            resp.set_cookie(COOKIE, cookie_token(admin), httponly=True, samesite="strict", path="/")
            return resp
        if not authorised(request, admin):
            raise forbidden()
        return Response(files["dashboard.html"], media_type="text/html; charset=utf-8")

    @router.get("/dashboard/{name}", include_in_schema=False)
    async def asset(request: Request, name: str) -> Response:
        if not authorised(request, admin_key()):
            raise forbidden()
        if name not in ASSETS:
            raise GatewayError(404, f"no dashboard file {name!r}", type="not_found_error", reason="not_found")
        return Response(files[name], media_type=ASSETS[name], headers={"cache-control": "no-cache"})

    @router.get("/admin/dashboard")
    async def data(request: Request) -> Response:
        if not authorised(request, admin_key()):
            raise forbidden()
        return Response(feed.body(), media_type="application/json", headers={"cache-control": "no-store"})

    return router
