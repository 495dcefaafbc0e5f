"""The director: one request's path through the gateway, phase by phase.

:meth:`Director.handle` reads as the list of its phases: receive → authenticate → resolve the model →
count tokens → predict → enqueue → wait for dispatch → forward (retrying on another backend while
nothing has reached the client) → settle. Each phase is one method here; the request's state and its
backend reservation are its :class:`~gateway.lifecycle.Lifecycle`, which releases the reservation
exactly once on every way out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from sagegate.core.distribution import LengthDistribution
from sagegate.core.outcomes import CancelStage, LateOutcome, Outcome, PredictionPath, Reason
from sagegate.core.predictor import Asked, LengthPredictor, Prediction
from sagegate.core.request import PredictionQuery
from sagegate.gateway import errors
from sagegate.gateway.access_log import access_fields, request_id
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.blame import RetryBudget, Verdicts
from sagegate.gateway.disconnect import DisconnectGuard
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.intake import ClientRequest, Intake
from sagegate.gateway.lifecycle import Lifecycle, RequestState
from sagegate.gateway.locality import session_key
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.openai_schema import Route
from sagegate.gateway.predict import cap, query_of
from sagegate.gateway.proxy import Proxy
from sagegate.gateway.queue import GatewayRequest, QueueFull
from sagegate.gateway.rate_limits import RateLimiter
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.stream import SHUTDOWN_MESSAGE
from sagegate.gateway.tenants import Identity, identify
from sagegate.gateway.tokens import ExactKeys, count_prompt
from sagegate.gateway.tracing import Tracing
from sagegate.gateway.tries import Ending, Tries, TriesEnded

log = logging.getLogger("sagegate.gateway")


class Director:
    def __init__(
        self,
        settings: GatewaySettings,
        intake: Intake,
        predictor: LengthPredictor,
        dispatcher: Dispatcher,
        pool: BackendPool,
        proxy: Proxy,
        metrics: GatewayMetrics,
        known_models: Callable[[], set[str]],
        draining: Callable[[], bool],
        limiter: RateLimiter,
        tracing: Tracing,
    ) -> None:
        self.settings = settings
        self.intake = intake
        self.predictor = predictor
        self.dispatcher = dispatcher
        self.pool = pool
        self.proxy = proxy
        self.metrics = metrics
        self.known_models = known_models
        self.draining = draining
        self.limiter = limiter
        self.tracing = tracing
        self.clock = dispatcher.clock
        up = settings.upstream
        self.retry_budget = RetryBudget(up.tenant_retry_rate, up.tenant_retry_burst, self.clock)
        self.lifecycles: dict[int, Lifecycle] = {}
        """Every request from enqueue to its end (streams included): empty when the gateway is idle."""
        self.waiting: set[asyncio.Task[Any]] = set()
        """Handlers in :meth:`serve` (queued, or waiting for a first byte or a whole answer)."""
        self._ids = itertools.count()

    @property
    def closing(self) -> bool:
        """:meth:`close_all` ran: the gateway is ending what is still running."""
        return self.proxy.closing

    async def handle(self, request: Request, route: Route) -> Response:
        """Answer one ``POST`` to a generation route; raises :class:`GatewayError` for the gateway's
        own refusals (the app turns them into responses)."""
        rid = request.state.request_id = request_id(request.headers)
        trace = request.state.trace = self.tracing.start(request.headers, rid, route)
        self.refuse_if_draining()
        try:
            client = await self.receive(request, route)
        except ClientDisconnect:  # the client left mid-upload: nothing to answer, nothing to log
            return self.client_gone(route, CancelStage.UPLOAD)
        async with DisconnectGuard(request.receive):
            arrival = self.clock()
            who = self.authenticate(request, arrival, client.body.get("priority"))
            session = self.session(request)
            self.resolve_model(client)
            query = await self.count_tokens(client, who)
            if self.settings.dispatch_first and self.dispatcher.idle():
                query = replace(query, wait_s=0.0)  # nothing to be ordered against: go on the prior
            if trace is not None:
                trace.phase("predict")
            asked = Asked(query, await self.predict(query))
            locality = self.dispatcher.locality
            chat = client.route is Route.CHAT
            exact = await locality.exact_keys(client.body, chat) if locality is not None else None
            req = self.describe(client, who, asked, arrival, session, exact, rid)
            req.trace = trace
            request.state.gateway_request = req
            if trace is not None:
                trace.phase("queue")
            lc = await self.admit(req)
            self.follow_late_prediction(lc, asked.prediction)
            return await self.serve(lc, asked)
        return self.client_gone(route)

    # --- before the queue ---------------------------------------------------------------------
    def refuse_if_draining(self) -> None:
        if self.draining():
            raise errors.unavailable(Reason.DRAINING, SHUTDOWN_MESSAGE, retry_after=1)

    async def receive(self, request: Request, route: Route) -> ClientRequest:
        """The body, within the size limit, parsed and validated (raises ``ClientDisconnect``)."""
        raw = await self.intake.read_body(request)
        return self.intake.parse(raw, route)

    def authenticate(self, request: Request, now: float, body_priority: object = None) -> Identity:
        """Tenant, priority band and deadline (401 for a bad key, 400 for a bad priority), by the
        keys in force (``rate_limits.file`` may replace them without a restart); a band above what
        the tenant may claim is lowered to it (or ``403``: ``rate_limits.priority_over``)."""
        self.limiter.reload()
        who = identify(request.headers, self.limiter.api_keys, now, body_priority)
        ceiling = self.limiter.band_ceiling(who.tenant)
        if who.priority > ceiling:
            if self.settings.rate_limits.priority_over == "reject":
                raise errors.forbidden(
                    f"priority band {who.priority} is above this key's {ceiling}", "priority"
                )
            return replace(who, priority=ceiling, band_ceiling=ceiling)
        return replace(who, band_ceiling=ceiling)

    def session(self, request: Request) -> str | None:
        """The client's session (``placement.session_header``) as a fixed-size key, when placement
        reads it (400 for an id over ``max_session_id_bytes``)."""
        p = self.settings.placement
        raw = request.headers.get(p.session_header)
        if not raw or self.dispatcher.locality is None:
            return None
        if len(raw) > p.max_session_id_bytes:  # (header values are latin-1: one byte a character)
            raise errors.bad_request(
                f"the {p.session_header} header is longer than {p.max_session_id_bytes} bytes",
                p.session_header,
            )
        return session_key(raw)

    def resolve_model(self, client: ClientRequest) -> None:
        """404 for a model no backend serves (when the backends list theirs)."""
        model = client.params.model
        known = self.known_models()
        if known and model not in known:
            raise errors.GatewayError(
                404, f"the model {model!r} does not exist", reason=Reason.MODEL_NOT_FOUND, param="model"
            )

    async def count_tokens(self, client: ClientRequest, who: Identity) -> PredictionQuery:
        """The prompt's length in tokens, in the question the predictor is asked (which names the
        request by the id it keeps to the end)."""
        try:
            prompt_tokens = count_prompt(client.prompt, self.settings.tokenizer)  # bounded: ~1 ms at most
        except (TypeError, ValueError, AttributeError, IndexError, KeyError):
            raise errors.bad_request("the prompt could not be tokenised", "prompt") from None
        rid = next(self._ids)
        return query_of(rid, client.prompt, max(1, prompt_tokens), client.params.model, who.tenant)

    async def predict(self, query: PredictionQuery) -> Prediction:
        """The output-length distribution and the path the predictor took; a failing predictor
        leaves the request without a prediction (path ``error``), never fails it."""
        try:
            prediction = await self.predictor.predict(query)
        except Exception:
            log.exception("the predictor failed; the request goes on without a prediction")
            prediction = Prediction(None, PredictionPath.ERROR)
        self.metrics.predictor_paths.labels(prediction.path).inc()
        if prediction.distribution is not None:
            self.metrics.predicted.observe(prediction.distribution.mean)
        return prediction

    def describe(
        self,
        client: ClientRequest,
        who: Identity,
        asked: Asked,
        arrival: float,
        session: str | None = None,
        exact: ExactKeys | None = None,
        request_id: str = "",
    ) -> GatewayRequest:
        """The request as the policy and the dispatcher see it (its prompt blocks keyed for placement)."""
        rid = asked.query.rid
        if self.settings.log_prompts:
            log.info("request %d from %s: %r", rid, who.tenant, client.prompt)
        max_tokens = client.max_tokens
        req = GatewayRequest(
            rid,
            arrival,
            asked.query.prompt_tokens,
            body=client.body,
            route=client.route,
            model=client.params.model,
            prompt=client.prompt,
            tenant=who.tenant,
            priority=who.priority,
            deadline_s=who.deadline_s,
            prediction=self.capped(asked.prediction.distribution, max_tokens),
            prediction_path=asked.prediction.path,
            stream=client.stream,
            want_usage=client.want_usage,
            max_tokens=max_tokens,
            request_id=request_id,
        )
        req.band_ceiling = who.band_ceiling
        locality = self.dispatcher.locality
        if locality is not None:
            locality.describe(req, session, exact)
        return req

    def capped(self, dist: LengthDistribution | None, max_tokens: int | None) -> LengthDistribution | None:
        """The prediction as the request carries it: capped at its ``max_tokens`` unless
        ``cap_at_max_tokens`` is off."""
        return cap(dist, max_tokens) if self.settings.cap_at_max_tokens else dist

    async def admit(self, req: GatewayRequest) -> Lifecycle:
        """Within the tenant's rate limits (``429`` past one), into the queue; the permit is given
        back when the request ends, however it ends."""
        try:
            permit = await self.limiter.admit(req.tenant, req.prompt_tokens, req.max_tokens)
        except errors.GatewayError:
            self.metrics.rejected(Reason.RATE_LIMIT_EXCEEDED)
            raise
        if permit is None:
            return self.enqueue(req)
        try:
            lc = self.enqueue(req)
        except BaseException:
            permit.end(None)
            raise
        lc.on_end = lambda: permit.end(lc.req.output_tokens)
        return lc

    def enqueue(self, req: GatewayRequest) -> Lifecycle:
        """Into the dispatcher's queue, unless the gateway is closing, no backend is healthy or the
        queue is full (503, 503, 429)."""
        retry = self.settings.queue.retry_after_s
        if self.closing:
            raise errors.unavailable(Reason.DRAINING, SHUTDOWN_MESSAGE, retry_after=1)
        if not self.pool.any_healthy():
            self.metrics.rejected(Reason.NO_HEALTHY_BACKEND)
            raise errors.unavailable(Reason.NO_HEALTHY_BACKEND, "no backend is healthy", retry)
        lc = Lifecycle(req, self.dispatcher, self.lifecycles)
        try:
            lc.enqueue()
        except QueueFull as exc:
            self.metrics.rejected(exc.reason)
            raise errors.busy(exc.reason, "the gateway's queue is full", retry) from exc
        return lc

    def follow_late_prediction(self, lc: Lifecycle, prediction: Prediction) -> None:
        """A prediction that missed its budget still comes: a request still queued then is ranked by it
        (the budget bounds what a request waits for, not what the queue may learn), one running is
        charged by it."""
        if prediction.later is None:
            return
        later = asyncio.ensure_future(prediction.later)

        def arrived(fut: asyncio.Future[LengthDistribution | None]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                outcome = LateOutcome.FAILED
            else:
                req = lc.req
                dist = self.capped(fut.result(), req.max_tokens)
                if dist is None:
                    outcome = LateOutcome.DISPATCHED
                elif lc.state is RequestState.QUEUED:
                    moved = self.dispatcher.repredict(req, dist)
                    outcome = LateOutcome.RERANKED if moved else LateOutcome.DISPATCHED
                else:
                    rebased = self.dispatcher.rebase(req, dist)
                    outcome = LateOutcome.REBASED if rebased else LateOutcome.DISPATCHED
            self.metrics.late_predictions.labels(outcome).inc()

        later.add_done_callback(arrived)

    # --- from the queue to the client -----------------------------------------------------------
    async def serve(self, lc: Lifecycle, asked: Asked) -> Response:
        """Wait for dispatch and forward with retry, settling ``lc`` on every way out: the client
        leaving, the gateway closing (a 503), a bug in the gateway."""
        task = asyncio.current_task()
        if task is not None:
            self.waiting.add(task)
        try:
            return await self.forward_with_retry(lc, asked)
        except asyncio.CancelledError:
            stage = lc.cancel()
            if stage is not None and not self.closing:
                self.metrics.cancellations.labels(stage).inc()
                self.proxy.ended(lc.req.trace, access_fields(lc.req, 499, Outcome.CLIENT_GONE, self.clock()))
            if self.closing and task is not None and task.cancelling():
                task.uncancel()  # cancelled by close_all, not by the client
                self.metrics.rejected(Reason.DRAINING)
                raise errors.unavailable(Reason.DRAINING, SHUTDOWN_MESSAGE, retry_after=1) from None
            raise
        except errors.GatewayError:
            raise
        except Exception:  # the gateway's own bug: still settle and count the request
            log.exception("request %s failed inside the gateway", lc.req.rid)
            if not lc.final:
                lc.fail()
            self.metrics.requests.labels(lc.req.route, Outcome.ERROR).inc()
            raise
        finally:
            if task is not None:
                self.waiting.discard(task)

    async def forward_with_retry(self, lc: Lifecycle, asked: Asked) -> Response:
        """Try the backend the dispatcher picks; on a failure before the first byte, queue again for
        another (``gateway.tries``, up to ``upstream.max_attempts`` tries): then 502, or 429 if a
        backend throttled. A failure the request may have caused waits for the next try's verdict
        (``gateway.blame``)."""
        tries = Tries(lc, self.pool, self.metrics, self.settings, self.retry_budget)
        try:
            outcome = await tries.run(lambda backend: self.proxy.attempt(lc, backend, asked))
        except TriesEnded as ended:
            raise self.refuse(lc, ended, tries) from None
        if tries.verdicts.suspects and outcome.status_code == 200:
            self.charge(tries.verdicts)
        return outcome

    def refuse(self, lc: Lifecycle, ended: TriesEnded, tries: Tries) -> errors.GatewayError:
        """End ``lc`` whose tries ended without an answer; the HTTP error that tells its client."""
        if ended.ending in (Ending.QUEUE_TIMEOUT, Ending.NO_HEALTHY_BACKEND):
            lc.withdraw()
        else:
            lc.reject()
        answer = self.answer(ended, tries)
        self.metrics.rejected(str(answer.reason))
        return answer

    def answer(self, ended: TriesEnded, tries: Tries) -> errors.GatewayError:
        retry = self.settings.queue.retry_after_s
        match ended.ending:
            case Ending.QUEUE_TIMEOUT:
                return errors.busy(ended.reason, "backends are busy; the request waited too long", retry)
            case Ending.NO_HEALTHY_BACKEND | Ending.REFUSED if ended.reason == Reason.NO_HEALTHY_BACKEND:
                return errors.unavailable(ended.reason, "no backend is healthy", retry)
            case Ending.REFUSED:
                why = f"the scheduling policy refused the request: {ended.reason}"
                return errors.busy(ended.reason, why, 1)
            case Ending.THE_REQUEST:
                return tries.verdicts.answer()
            case Ending.BUDGET_SPENT:
                why = f"backend failed: {ended.why}; not retried (this tenant's retry budget is spent)"
                return errors.upstream_failed(why, ended.reason)
        throttled = tries.throttled
        if throttled is not None:
            why = f"the backend is over its rate limit ({throttled.why})"
            return errors.rate_limited(why, throttled.retry_after)
        return errors.upstream_failed(f"backends failed: {ended.why}")

    def charge(self, verdicts: Verdicts) -> None:
        """Another backend served the request: charge the suspect backends that answered no one else
        since they failed it."""
        by_name = {b.name: b for b in self.pool.backends}

        def answered_since(name: str, since: float) -> bool:
            at = by_name[name].answered_at
            return at is not None and at > since

        charged = verdicts.charged_on_success(answered_since)
        for name in charged:
            self.pool.request_failed(by_name[name], hard=False)
        self.metrics.suspect_failures.labels("backend").inc(len(charged))
        self.metrics.suspect_failures.labels("this_input").inc(len(verdicts.suspects) - len(charged))

    # --- the end ----------------------------------------------------------------------------------
    def client_gone(self, route: Route, stage: CancelStage | None = None) -> Response:
        """The client left before its answer: nothing to send (499 for the access log)."""
        if stage is not None:
            self.metrics.cancellations.labels(stage).inc()
        self.metrics.requests.labels(route, Outcome.CLIENT_GONE).inc()
        return Response(status_code=499)

    def close_all(self, message: str = SHUTDOWN_MESSAGE) -> None:
        """End everything still running (the drain deadline): streams with an SSE error event, the
        rest with a 503, every reservation released. New requests get 503 from now on."""
        self.proxy.closing = True
        streams, waiting = list(self.proxy.streams), list(self.waiting)
        for stream in streams:
            stream.abort(message)
        for task in waiting:
            task.cancel()
        if streams or waiting:
            log.warning("drain deadline: ended %d streams and %d requests", len(streams), len(waiting))
