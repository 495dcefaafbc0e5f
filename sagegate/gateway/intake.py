"""From HTTP request to a validated :class:`ClientRequest`: size limit, strict JSON, the route's schema,
the gateway's limits. Every refusal here is a 4xx :class:`GatewayError`; nothing a client sends becomes
a 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from sagegate.gateway import errors, jsonbody
from sagegate.gateway.openai_schema import ChatCompletionRequest, CompletionRequest, OpenAIRequest, Route
from sagegate.gateway.settings import GatewaySettings

DRAIN_FACTOR = 4
"""How much of an over-limit body is read and dropped before the ``413`` (see ``Intake.read_body``)."""

MODELS: dict[Route, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    Route.CHAT: ChatCompletionRequest,
    Route.COMPLETIONS: CompletionRequest,
}


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A request body that passed validation: ``body`` as sent (forwarded untouched, unknown fields
    included), ``params`` the validated model the gateway reads its fields from."""

    route: Route
    body: dict[str, Any]
    params: OpenAIRequest

    @property
    def prompt(self) -> Any:
        """The chat messages or the completion prompt, as sent (what the tokenizer counts)."""
        return self.body["messages"] if self.route is Route.CHAT else self.body["prompt"]

    @property
    def max_tokens(self) -> int | None:
        """The client's cap on the output: ``max_completion_tokens``, else ``max_tokens``."""
        p = self.params
        return getattr(p, "max_completion_tokens", None) or p.max_tokens

    @property
    def stream(self) -> bool:
        return bool(self.params.stream)

    @property
    def want_usage(self) -> bool:
        opts = self.params.stream_options
        return bool(opts is not None and opts.include_usage)


class Intake:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings

    async def read_body(self, request: Request) -> bytes:
        """The body, at most ``limits.max_body_bytes``. A body over the limit is refused with ``413``
        after reading (and dropping) up to ``DRAIN_FACTOR`` × the limit of it: a server that answers
        while the client is still sending and then closes resets the connection, and the client sees
        a connection error instead of the ``413``. A client that waits for ``100 Continue`` gets the
        ``413`` at once instead (the server sends ``100`` only when the body is first read)."""
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if request.headers.get("expect", "").lower() == "100-continue":
                raise errors.too_large(limit)  # before ``100 Continue``: the client sends nothing more
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

    def parse(self, raw: bytes, route: Route) -> ClientRequest:
        """The body, validated against the route's schema and the gateway's limits."""
        try:
            body = jsonbody.loads(raw, self.settings.limits.max_json_depth)
        except jsonbody.BodyError as exc:
            raise errors.bad_request(str(exc)) from None
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        try:
            params = MODELS[route].model_validate(body, strict=True)  # JSON types as sent: "5" is no integer
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
        return ClientRequest(route, body, params)
