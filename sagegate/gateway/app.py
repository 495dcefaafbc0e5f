"""The gateway as an ASGI app: ``create_app(settings)`` wires the pieces and declares the routes.

Request path: the director (``gateway.director``) takes a request through its phases: intake (limits,
validation), identity, token count, prediction → dispatcher queue (policy order, memory-aware
admission) → proxy (pooled upstream client, retries, streaming) → settle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from sagegate.core.outcomes import Reason
from sagegate.core.predictor import LengthPredictor
from sagegate.gateway import errors
from sagegate.gateway.access_log import REQUEST_ID_HEADER, access_fields
from sagegate.gateway.admin import MAX_LIMIT, queue_snapshot
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.clock import fleet_clock
from sagegate.gateway.dashboard import FEED_TTL_S, FeedCache, Sampler, build_feed, dashboard_router
from sagegate.gateway.director import Director
from sagegate.gateway.dispatcher import Dispatcher, PauseVerdict
from sagegate.gateway.errors import GatewayError
from sagegate.gateway.intake import Intake
from sagegate.gateway.kv_events import KVEventHub
from sagegate.gateway.ledger import SharedLedger
from sagegate.gateway.locality import Locality
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.openai_schema import ChatCompletionRequest, CompletionRequest, ErrorBody, Route
from sagegate.gateway.predict import Recorder, build_predictor
from sagegate.gateway.proxy import Proxy
from sagegate.gateway.queue import BoundedQueue
from sagegate.gateway.rate_limits import RateLimiter
from sagegate.gateway.redact import redact_client_logs
from sagegate.gateway.settings import GatewaySettings, OpenEndpoint
from sagegate.gateway.shared_prefixes import shared_prefixes
from sagegate.gateway.state_metrics import StateGauges
from sagegate.gateway.tenants import bearer, is_admin, match_key
from sagegate.gateway.tokens import count_text
from sagegate.gateway.tracing import Tracing
from sagegate.gateway.upstream import backend_headers, upstream_client
from sagegate.policies.base import Policy
from sagegate.policies.placement import CACHE_AWARE
from sagegate.policies.registry import parse_policy

log = logging.getLogger("sagegate.gateway")


class Gateway:
    """Everything one gateway process holds; ``app.state.gateway``."""

    def __init__(
        self,
        settings: GatewaySettings,
        policy: Policy | None = None,
        predictor: LengthPredictor | None = None,
        span_exporter: Any = None,
    ) -> None:
        self.settings = settings
        self.clock = fleet_clock
        self.policy = policy if policy is not None else gateway_policy(settings)
        self.predictor = predictor if predictor is not None else build_predictor(
            settings.predictor, settings.redis_url, settings.predictor_options
        )  # fmt: skip
        self.client = upstream_client(settings.upstream, backend_headers(settings))
        self.metrics = GatewayMetrics()
        self.pool = BackendPool(settings, self.client, on_change=self._on_change, clock=self.clock)
        self.queue = BoundedQueue(self.policy, settings.queue.max_requests, settings.queue.max_tokens)
        admission = settings.admission.config()
        self.ledger: SharedLedger | None = None
        """The admission ledger shared with other replicas (on with ``redis_url``: ``ledger.enabled``)."""
        if settings.ledger_on and settings.redis_url:
            self.ledger = SharedLedger(
                settings.ledger,
                settings.redis_url,
                self.pool.loads,
                [b.shown_url for b in self.pool.backends],
                admission,
                on_change=self._on_change,
                clock=self.clock,
            )
        self.dispatcher = Dispatcher(
            self.policy,
            self.pool,
            admission,
            self.queue,
            self.metrics,
            capacity_requests=settings.capacity_requests_per_backend,
            pending_s=settings.admission.pending_s,
            clock=self.clock,
            ledger=self.ledger,
            pause=settings.pause.config(),
            locality=(
                Locality(settings.placement, self.pool.backends, self.metrics, self.client)
                if settings.placement.mode == CACHE_AWARE
                else None
            ),
            placement=settings.placement.profile.build(),
        )
        self.kv_events: KVEventHub | None = None
        """Followers of the backends' KV-cache events (precise placement; cache-aware mode only)."""
        if self.dispatcher.locality is not None and any(b.kv_events for b in settings.backends):
            self.kv_events = KVEventHub(
                self.pool.backends, [b.kv_events for b in settings.backends], settings.placement.kv_events
            )
        self.dispatcher.pause_enabled = settings.pause.enabled
        self.dispatcher.pause_bands = settings.pause.bands
        self.shared_prefixes = shared_prefixes(
            settings, self.dispatcher.locality, self.pool.backends, self.metrics.registry
        )
        """The prefix index shared with other replicas through Redis (``placement.share``)."""
        self.recorder = Recorder(self.predictor)
        self.limiter = RateLimiter(
            settings.rate_limits, settings.api_keys, settings.redis_url, settings.limits.max_tokens
        )
        self.tracing = Tracing(settings.tracing, span_exporter)
        self.proxy = Proxy(
            settings,
            self.dispatcher,
            self.pool,
            self.client,
            self.metrics,
            self.recorder,
            self.limiter.tenant_label,
        )
        self.director = Director(
            settings,
            Intake(settings),
            self.predictor,
            self.dispatcher,
            self.pool,
            self.proxy,
            self.metrics,
            self._known_models,
            lambda: self.draining,
            self.limiter,
            self.tracing,
        )
        self.metrics.attach_state(StateGauges(self.queue, self.pool))
        self.metrics.attach_state(self.limiter.collect)
        if self.kv_events is not None:
            self.metrics.attach_state(self.kv_events.collect)
        cfg = self.dispatcher.cfg
        self.feed = FeedCache(lambda now: build_feed(self, cfg, now), self.clock, FEED_TTL_S)
        self.sampler = Sampler(self, lambda: len(self.queue), self.clock)
        self.draining = False
        self.started = False

    def _on_change(self) -> None:
        if self.started:
            self.dispatcher.kick()

    def _known_models(self) -> set[str]:
        return {str(m["id"]) for m in self.pool.models()}

    async def start(self) -> None:
        await asyncio.to_thread(count_text, "warm up", self.settings.tokenizer)  # loads the BPE (~1 s)
        await self.predictor.start()
        await self.pool.start()
        if self.kv_events is not None:
            self.kv_events.start()
        if self.ledger is not None:
            await self.ledger.start()
        if self.shared_prefixes is not None:
            await self.shared_prefixes.start()
        self.sampler.start()
        self.started = True
        self.dispatcher.kick()

    async def stop(self) -> None:
        self.draining = True
        await self.sampler.stop()
        await self.pool.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.ledger is not None:
            await self.ledger.stop()
        if self.shared_prefixes is not None:
            await self.shared_prefixes.stop()
        await self.recorder.drain()
        await self.limiter.close()
        self.tracing.close()
        await self.predictor.close()
        await self.client.aclose()

    def ready(self) -> bool:
        return self.started and not self.draining and self.pool.any_healthy()

    def queue_snapshot(self, limit: int) -> dict[str, Any]:
        running = (p.request for p in self.dispatcher.pausable.values())
        snap = queue_snapshot(self.policy.name, self.queue, self.pool, self.clock(), limit, running)
        report = self.metrics.forecasts
        snap["forecast"] = {"median_error": report.median_errors(), "factors": report.factors()}
        return snap


def create_app(
    settings: GatewaySettings,
    *,
    policy: Policy | None = None,
    predictor: LengthPredictor | None = None,
    span_exporter: Any = None,
) -> FastAPI:
    """The gateway app. ``policy``/``predictor`` override the ones ``settings`` names, and
    ``span_exporter`` receives every span at once with tracing on (tests)."""
    redact_client_logs()
    gw = Gateway(settings, policy, predictor, span_exporter)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="sagegate", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        if exc.status >= 400:
            gw.metrics.requests.labels(_route(request), str(exc.status)).inc()
        return _identified(request, exc)

    def _identified(request: Request, exc: GatewayError) -> Response:
        """A refusal with its request's id, and its access-log line (a generation request's)."""
        response = exc.response()
        rid = getattr(request.state, "request_id", None)
        if rid is None:
            return response
        response.headers[REQUEST_ID_HEADER] = rid
        req = getattr(request.state, "gateway_request", None)
        why = str(exc.reason or exc.status)
        if req is not None:
            fields = access_fields(req, exc.status, why, gw.dispatcher.clock())
        else:
            fields = {"id": rid, "route": _route(request), "status": exc.status, "outcome": why}
        gw.proxy.ended(getattr(request.state, "trace", None), fields)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return GatewayError(
            exc.status_code, str(exc.detail), reason=Reason.HTTP_ERROR, headers=exc.headers
        ).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        """A bad query parameter (``/admin/queue?limit=abc``): OpenAI's shape, not FastAPI's."""
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "header", "body")]
        param = ".".join(loc) or None
        msg = str(first.get("msg", "invalid request"))
        return errors.bad_request(f"{param}: {msg}" if param else msg, param).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> Response:
        log.exception("internal error")
        return _identified(
            request, GatewayError(500, "internal error", type="internal_error", reason=Reason.INTERNAL_ERROR)
        )

    @app.post("/v1/chat/completions", openapi_extra=_body_doc("ChatCompletionRequest"), responses=_RESPONSES)
    async def chat_completions(request: Request) -> Response:
        return await gw.director.handle(request, Route.CHAT)

    @app.post("/v1/completions", openapi_extra=_body_doc("CompletionRequest"), responses=_RESPONSES)
    async def completions(request: Request) -> Response:
        return await gw.director.handle(request, Route.COMPLETIONS)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        require_key(request, "models")
        return {"object": "list", "data": gw.pool.models()}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        ok = gw.ready()
        status = "ready" if ok else ("draining" if gw.draining else "no_healthy_backend")
        return JSONResponse({"status": status}, status_code=200 if ok else 503)

    for path, probe in (("/health", health), ("/ready", ready)):  # load balancers probe with HEAD
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_key(request, "metrics")
        return Response(gw.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def require_key(request: Request, endpoint: OpenEndpoint) -> None:
        """With API keys set, an endpoint not in ``open_endpoints`` needs a client's or the admin key."""
        keys = gw.limiter.api_keys
        if not keys or endpoint in settings.open_endpoints:
            return
        if is_admin(request.headers, settings.admin_key):
            return
        if match_key(bearer(request.headers), keys) is None:
            raise errors.unauthorized()

    @app.get("/admin/queue")
    async def admin_queue(request: Request, limit: int = 100) -> Response:
        if not is_admin(request.headers, settings.admin_key):
            raise GatewayError(
                403, "admin key required", type="authentication_error", reason=Reason.FORBIDDEN
            )
        return JSONResponse(gw.queue_snapshot(max(0, min(limit, MAX_LIMIT))))

    @app.get("/admin/ledger")
    async def admin_ledger(request: Request) -> Response:
        if not is_admin(request.headers, settings.admin_key):
            raise GatewayError(
                403, "admin key required", type="authentication_error", reason=Reason.FORBIDDEN
            )
        if gw.ledger is None:
            return JSONResponse({"mode": "off"})
        return JSONResponse(gw.ledger.snapshot() | {"held_for_others": gw.dispatcher.held_for_others})

    @app.post("/admin/requests/{rid}/pause")
    async def admin_pause(request: Request, rid: str) -> Response:
        """Pause a running request now (``pause.enabled``): it resumes on its own when dispatched."""
        if not is_admin(request.headers, settings.admin_key):
            raise GatewayError(
                403, "admin key required", type="authentication_error", reason=Reason.FORBIDDEN
            )
        verdict = gw.dispatcher.try_pause(rid)
        if verdict is PauseVerdict.PAUSED:
            return JSONResponse({"id": rid, "paused": True})
        if verdict is PauseVerdict.DISABLED:
            raise GatewayError(409, "pausing is off (pause.enabled: false)", reason=Reason.PAUSE_DISABLED)
        if verdict is PauseVerdict.UNKNOWN and not any(
            str(lc.req.rid) == rid for lc in gw.director.lifecycles.values()
        ):
            raise GatewayError(
                404,
                f"no request {rid!r} is running",
                type="not_found_error",
                reason=Reason.NOT_FOUND,
                param="rid",
            )
        raise GatewayError(
            409, f"request {rid!r} cannot be paused now ({verdict})", reason=Reason.NOT_PAUSABLE
        )

    app.include_router(dashboard_router(gw.feed, lambda: settings.admin_key))

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        require_key(request, "openapi")
        return JSONResponse(_openapi(app))

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "HEAD", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["x-sagegate-reason", "retry-after"],
            max_age=600,
        )
    return app


def gateway_policy(settings: GatewaySettings) -> Policy:
    """The policy ``settings.policy`` names, with the starvation bound ``queue.aged_share`` sets."""
    share = settings.queue.aged_share
    defaults = {"max_wait_s": share * settings.queue.max_wait_s} if share > 0 else None
    return parse_policy(settings.policy, defaults)


def _route(request: Request) -> str:
    path = request.url.path
    return (
        "chat"
        if path.endswith("chat/completions")
        else "completions"
        if path.endswith("completions")
        else path
    )


def _body_doc(name: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/json": {}, "text/event-stream": {}},
        "description": "The backend's answer.",
    },
    400: {**_ERROR, "description": "Invalid request."},
    401: {**_ERROR, "description": "Missing or invalid API key."},
    404: {**_ERROR, "description": "Unknown model."},
    413: {**_ERROR, "description": "Body too large."},
    429: {**_ERROR, "description": "Queue full or waited too long; see Retry-After and x-sagegate-reason."},
    502: {**_ERROR, "description": "Every backend tried failed."},
    503: {**_ERROR, "description": "No healthy backend, or draining."},
}


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionRequest, CompletionRequest, ErrorBody):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
    app.openapi_schema = schema
    return schema
