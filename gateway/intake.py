"""From HTTP request to :class:`GatewayRequest`: size limit, JSON, validation, identity, token count,
prediction. Every refusal here is a 4xx :class:`GatewayError`; nothing a client sends becomes a 500.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway import errors, jsonbody
from gateway.metrics import GatewayMetrics
from gateway.openai_schema import ChatCompletionRequest, CompletionRequest
from gateway.predict import GatewayPredictor, PredictInput, cap
from gateway.queue import GatewayRequest
from gateway.settings import GatewaySettings
from gateway.tenants import identify
from gateway.tokens import acount_prompt

log = logging.getLogger("sagegate.gateway")

DRAIN_FACTOR = 4
"""How much of an over-limit body is read and dropped before the ``413`` (see ``Intake.read_body``)."""

MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "completions": CompletionRequest}


class Intake:
    def __init__(
        self,
        settings: GatewaySettings,
        predictor: GatewayPredictor,
        metrics: GatewayMetrics,
        known_models: Callable[[], set[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.predictor = predictor
        self.metrics = metrics
        self.known_models = known_models
        self.clock = clock
        self._ids = itertools.count()

    async def read_body(self, request: Request) -> bytes:
        """The body, at most ``limits.max_body_bytes``. A body over the limit is refused with ``413``
        after reading (and dropping) up to ``DRAIN_FACTOR`` × the limit of it: a server that answers
        while the client is still sending and then closes resets the connection, and the client sees
        a connection error instead of the ``413``."""
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if int(declared) <= DRAIN_FACTOR * limit:
                async for _ in request.stream():
                    pass
            raise errors.too_large(limit)
        parts: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                if size <= DRAIN_FACTOR * limit:
                    continue  # read on (dropping it), then refuse
                raise errors.too_large(limit)
            parts.append(chunk)
        if size > limit:
            raise errors.too_large(limit)
        return b"".join(parts)

    def parse(self, raw: bytes, route: str) -> dict[str, Any]:
        """The body as a dict, validated against the route's schema and the gateway's limits."""
        try:
            body = jsonbody.loads(raw, self.settings.limits.max_json_depth)
        except jsonbody.BodyError as exc:
            raise errors.bad_request(str(exc)) from None
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        try:
            MODELS[route].model_validate(body, strict=True)  # JSON types as sent: "5" is no integer
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise errors.bad_request(
                f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param
            ) from None
        limits = self.settings.limits
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if value is not None and value > limits.max_tokens:
                raise errors.bad_request(f"{name} must be at most {limits.max_tokens}", name)
        n = body.get("n")
        if n is not None and n > limits.max_n:
            raise errors.bad_request(f"n must be at most {limits.max_n}", "n")
        if body.get("stream_options") is not None and not body.get("stream"):
            raise errors.bad_request("stream_options is only allowed with stream=true", "stream_options")
        prompt = body.get("prompt")
        if (
            route == "completions"
            and isinstance(prompt, list)
            and prompt
            and isinstance(prompt[0], str | list)
        ) and len(prompt) != 1:
            raise errors.bad_request("batched prompts are not supported; send one prompt", "prompt")
        return body

    async def build(
        self, request: Request, route: str, body: dict[str, Any]
    ) -> tuple[GatewayRequest, PredictInput]:
        now = self.clock()
        who = identify(request.headers, self.settings.api_keys, now)
        model = body["model"]
        known = self.known_models()
        if known and model not in known:
            raise errors.GatewayError(
                404, f"the model {model!r} does not exist", reason="model_not_found", param="model"
            )
        prompt = body["messages"] if route == "chat" else body["prompt"]
        try:
            prompt_tokens = await acount_prompt(prompt, self.settings.tokenizer)
        except (TypeError, ValueError, AttributeError, IndexError, KeyError):
            raise errors.bad_request("the prompt could not be tokenised", "prompt") from None
        inp = PredictInput(prompt, max(1, prompt_tokens), model, who.tenant)
        try:
            dist, path = await self.predictor.predict(inp)
        except Exception:
            log.exception("the predictor failed; the request goes on without a prediction")
            dist, path = None, "error"
        self.metrics.predictor_paths.labels(path).inc()
        if dist is not None:
            self.metrics.predicted.observe(dist.mean)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        rid = next(self._ids)
        if self.settings.log_prompts:
            log.info("request %d from %s: %r", rid, who.tenant, prompt)
        req = GatewayRequest(
            rid,
            now,
            inp.prompt_tokens,
            body=body,
            route=route,
            model=model,
            prompt=prompt,
            tenant=who.tenant,
            priority=who.priority,
            deadline_s=who.deadline_s,
            prediction=cap(dist, max_tokens) if self.settings.cap_at_max_tokens else dist,
            path=path,
        )
        return req, inp
