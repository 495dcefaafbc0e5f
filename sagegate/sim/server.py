"""The simulated backend: an OpenAI-compatible server with vLLM's endpoints and metric names, running
the project's engine model (sim/engine.py) on a real clock, optionally sped up.

This module is the HTTP app: request checks, submission, streaming and the routes. Its parts live
next to it: :mod:`sim.server_runner` (the engine loop and its clock; how steps, arrivals and
cancellations are timed), :mod:`sim.server_metrics` (``/metrics`` with vLLM's names) and
:mod:`sim.server_api` (OpenAI's request and response shapes). ``sim.server`` stays the import path.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sagegate.core.sse import json_event
from sagegate.core.tokens import encode, flatten_messages
from sagegate.policies.engine_priority import PriorityPolicy
from sagegate.policies.registry import parse_policy
from sagegate.sim.engine import Engine
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.kv_events import EventLog, Publisher
from sagegate.sim.perf import PerfModel
from sagegate.sim.prefix import CHARS_PER_TOKEN
from sagegate.sim.server_api import (
    FILLER,
    ApiError,
    ChatBody,
    CompletionBody,
    GenerationBody,
    ResponseShape,
    TokenizeBody,
    filler_word,
    validation_error,
    written_before,
)
from sagegate.sim.server_metrics import Metrics
from sagegate.sim.server_runner import SCHEDULING_POLICIES, BackendSettings, EngineRunner, Stream

__all__ = [
    "SCHEDULING_POLICIES",
    "ApiError",
    "BackendSettings",
    "EngineRunner",
    "Metrics",
    "PriorityPolicy",
    "SimulatedBackend",
    "create_app",
]

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions; used for chat too (vLLM's would fill the context)


@dataclass
class _Prompt:
    tokens: int
    key: str  # token ids packed CHARS_PER_TOKEN characters apiece: exact prefix-cache content keys
    written: int = 0
    """Tokens of the response the prompt already ends with (a continuation, see ``written_before``)."""


def _pack(ids: list[int]) -> str:
    """Token ids as text of exactly ``CHARS_PER_TOKEN`` characters per token, so the engine's
    text-based prefix keys see token content block for block."""
    assert CHARS_PER_TOKEN == 4
    return struct.pack(f"<{len(ids)}I", *ids).decode("latin-1")


@lru_cache(maxsize=1)
def _filler_ids() -> tuple[int, ...] | None:
    """Each filler word's one token id (None if the tokenizer splits one: no output content keys)."""
    ids = [encode(filler_word(i)) for i in range(len(FILLER))]
    return tuple(i[0] for i in ids) if all(len(i) == 1 for i in ids) else None


def _warm_up() -> None:
    """Load what the first request would otherwise load: the tokenizer and the filler's ids."""
    encode("warm up")
    _filler_ids()


def _output_ids(written: int, n: int) -> list[int] | None:
    """The token ids of the output a request will write (the simulated model's text is known in
    advance), as vLLM would key their blocks for its prefix cache."""
    table = _filler_ids()
    if table is None:
        return None
    k = len(table)
    return [table[(written + i) % k] for i in range(n)]


class SimulatedBackend:
    """Request handling shared by the routes: validation, submission, response shapes."""

    def __init__(self, settings: BackendSettings) -> None:
        cfg = settings.engine
        self.settings = settings
        self.perf = PerfModel(get_model(cfg.model), get_gpu(cfg.gpu), tp=cfg.tensor_parallel_size)
        policy = parse_policy("fcfs") if settings.scheduling_policy == "fcfs" else PriorityPolicy()
        self.engine = Engine(self.perf, cfg, policy)
        self.model_name = settings.model_name
        self.vocab = self.perf.model.vocab
        self.max_model_len = self.engine.capacity_tokens
        self.metrics = Metrics(self.model_name)
        self.runner = EngineRunner(self.engine, settings, self.metrics)
        self.metrics.attach(self.runner, settings)
        self.kv_events = settings.kv_events if settings.kv_events and settings.kv_events.active else None
        if self.kv_events is not None:
            self.runner.kv_log = self.engine.pool.events = EventLog(cfg.block_size, self.kv_events.layout)
        if self.max_model_len < 2:
            raise ValueError(
                f"the KV pool of {cfg.model} on {cfg.gpu} holds {self.max_model_len} tokens: nothing can run"
            )

    # --- parsing --------------------------------------------------------------------------------
    @staticmethod
    async def read_json(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"invalid JSON body: {exc}") from exc

    def check_common(self, body: GenerationBody) -> int:
        """Checks shared by both generation routes; returns the cap on the output: ``max_tokens``,
        else 16."""
        if body.model is not None and body.model != self.model_name:
            raise ApiError(f"The model `{body.model}` does not exist.", param="model")
        if body.n != 1:
            raise ApiError("n must be 1 on the simulated backend", param="n")
        if body.stream_options is not None and not body.stream:
            raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
        if body.priority != 0 and self.settings.scheduling_policy != "priority":
            raise ApiError(
                f"Got priority {body.priority} but priority scheduling is not enabled.", param="priority"
            )
        max_tokens = self.client_cap(body)
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        return DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens

    def output_length(self, body: GenerationBody, cap: int, written: int) -> int:
        """What this request generates: the forced length (``sim_output_tokens``, the response's
        whole length, of which a continuation's prompt already holds ``written``) within the client's
        ``max_tokens``, else ``cap`` (no EOS in a simulated model). At least one token."""
        forced = body.sim_output_tokens
        if forced is None:
            return cap
        client = self.client_cap(body)
        rest = forced - written
        return max(1, rest if client is None else min(rest, client))

    @staticmethod
    def client_cap(body: GenerationBody) -> int | None:
        """The client's ``max_tokens`` (``max_completion_tokens`` for chat), None when not sent."""
        if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
            return body.max_completion_tokens
        return body.max_tokens

    def encode_input(self, text: str) -> list[int]:
        """The input's token ids; an input the tokenizer refuses is the client's error (400), as vLLM
        answers an input beyond the model's context, never a 500."""
        try:
            return encode(text)
        except ValueError as exc:
            raise ApiError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"request has about {len(text) // 4} input tokens ({exc}). Please reduce the length "
                "of the input."
            ) from None

    def prompt_of(self, prompt: Any) -> _Prompt:
        """A completion prompt: text, token ids, or a one-element list of either."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ApiError("batched prompts are not supported by the simulated backend", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.encode_input(prompt)
        else:
            ids = list(prompt)
            bad = next((t for t in ids if not 0 <= t < self.vocab), None)
            if bad is not None:
                raise ApiError(f"token id {bad} is out of vocabulary (< {self.vocab})", param="prompt")
        if not ids:
            raise ApiError("The prompt cannot be empty.", param="prompt")
        return _Prompt(len(ids), _pack(ids), written_before(prompt) if isinstance(prompt, str) else 0)

    def chat_prompt_of(self, body: ChatBody) -> _Prompt:
        """The messages as one prompt; with ``continue_final_message`` (vLLM's rules: not with
        ``add_generation_prompt``, the last message the assistant's) the response goes on from the
        last message's text."""
        messages = body.messages
        if not messages:
            raise ApiError("messages must not be empty", param="messages")
        written = 0
        if body.continue_final_message:
            if body.add_generation_prompt:
                raise ApiError(
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                    param="continue_final_message",
                )
            last = messages[-1]
            if last.role != "assistant":
                raise ApiError(
                    "continue_final_message needs the last message to be the assistant's",
                    param="continue_final_message",
                )
            written = written_before(last.content) if isinstance(last.content, str) else 0
        ids = self.encode_input(flatten_messages([m.model_dump() for m in messages]))
        return _Prompt(max(1, len(ids)), _pack(ids or [0]), written)

    def check_length(self, prompt: _Prompt, max_tokens: int) -> None:
        if prompt.tokens + max_tokens > self.max_model_len:
            raise ApiError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt.tokens + max_tokens} tokens ({prompt.tokens} in the prompt, {max_tokens} in the "
                "completion). Please reduce the length of the prompt or completion.",
                param="max_tokens",
            )

    # --- running ---------------------------------------------------------------------------------
    async def generate(
        self, request: Request, body: GenerationBody, prompt: _Prompt, cap: int, chat: bool
    ) -> Any:
        output_tokens = self.output_length(body, cap, prompt.written)
        self.check_length(prompt, max(output_tokens, self.client_cap(body) or 0))  # vLLM checks the cap
        key, content = prompt.key, None
        ids = _output_ids(prompt.written, output_tokens)
        if ids is not None:  # the output's blocks get content keys: a continuation finds them cached
            key, content = key + _pack(ids), prompt.tokens + output_tokens
        stream = self.runner.submit(prompt.tokens, output_tokens, key, body.priority, content)
        shape = ResponseShape(self.model_name, chat, prompt.tokens, prompt.written)
        if body.stream:
            opts = body.stream_options
            usage = opts is not None and opts.include_usage
            shape.running = usage and opts is not None and opts.continuous_usage_stats
            return StreamingResponse(self._sse(stream, shape, usage), media_type="text/event-stream")
        collect = asyncio.ensure_future(_drain(stream))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            collect.cancel()
            gone.cancel()
            self.runner.cancel(stream)  # a no-op once finished
        if not stream.finished:
            return Response(status_code=499)  # the client left (or the server is stopping)
        return shape.full(stream.req.generated, self.cached_tokens(stream))

    def cached_tokens(self, stream: Stream) -> int | None:
        """What usage reports as the prompt's cached tokens (None: not reported, vLLM's default)."""
        return stream.req.cached_tokens if self.settings.prompt_tokens_details else None

    async def _sse(self, stream: Stream, shape: ResponseShape, usage: bool) -> AsyncIterator[bytes]:
        """Server-sent events, one chunk per token, written when the step that made it ends."""
        try:
            sent = 0
            done = False
            while not done:
                items = [await stream.queue.get()]
                while not stream.queue.empty():
                    items.append(stream.queue.get_nowait())
                # Chat opens with a role chunk, sent with the first token (as vLLM does) so that a
                # client timing its first chunk measures the time to first token.
                opening = shape.chat and sent == 0 and items[0] is not None
                parts = [json_event(shape.chunk(None, None))] if opening else []
                for item in items:
                    if item is None:
                        done = True
                        break
                    for _ in range(item):
                        sent += 1
                        last = sent >= stream.req.output_tokens
                        word = filler_word(shape.written + sent - 1)
                        parts.append(json_event(shape.chunk(word, "length" if last else None, sent)))
                if parts:
                    yield b"".join(parts)
            if not stream.finished:
                return  # stopped by a shutdown: end the stream without [DONE]
            if usage:
                yield json_event(shape.usage_chunk(sent, self.cached_tokens(stream)))
            yield b"data: [DONE]\n\n"
        finally:
            self.runner.cancel(stream)


async def _drain(stream: Stream) -> None:
    while await stream.queue.get() is not None:
        pass


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read already, so ``receive`` now waits for
    ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ApiKeyMiddleware:
    """vLLM's ``--api-key``: the ``/v1`` routes want ``Authorization: Bearer KEY`` (compared in
    constant time), else ``401 {"error": "Unauthorized"}``."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.key = hashlib.sha256(key.encode()).digest()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith("/v1"):
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = auth.decode("latin-1").partition(" ")
            given = hashlib.sha256(token.encode()).digest()
            if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.key):
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: BackendSettings | None = None) -> FastAPI:
    """The simulated backend as an ASGI app. Raises ValueError for a bad model, GPU or engine setting."""
    settings = settings or BackendSettings()
    be = SimulatedBackend(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The BPE tables and the output's token ids load before the port opens (~1 s on a slow
        # machine): else the first request pays for them, as vLLM's would not (it warms up first).
        await asyncio.to_thread(_warm_up)
        if be.kv_events is not None:
            be.runner.kv_publisher = Publisher(be.kv_events)
            be.runner.kv_publisher.start()
        be.runner.start_clock()
        task = asyncio.create_task(be.runner.run(), name="sim-engine-loop")
        try:
            yield
        finally:
            task.cancel()
            be.runner.shutdown()
            if be.runner.kv_publisher is not None:
                be.runner.kv_publisher.close()

    app = FastAPI(title="sagegate simulated backend", lifespan=lifespan)
    app.state.backend = be
    if settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=settings.api_key)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return ApiError(str(exc.detail), status=exc.status_code, kind=kind).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return ApiError(f"internal error: {exc!r}", status=500, kind="InternalServerError").response()

    def parse(model: type[BaseModel], raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise ApiError("the request body must be a JSON object")
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            raise validation_error(exc) from exc

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body: CompletionBody = parse(CompletionBody, await be.read_json(request))
        cap = be.check_common(body)
        return await be.generate(request, body, be.prompt_of(body.prompt), cap, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body: ChatBody = parse(ChatBody, await be.read_json(request))
        cap = be.check_common(body)
        return await be.generate(request, body, be.chat_prompt_of(body), cap, chat=True)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body: TokenizeBody = parse(TokenizeBody, await be.read_json(request))
        if body.model is not None and body.model != be.model_name:
            raise ApiError(f"The model `{body.model}` does not exist.", param="model")
        if body.messages is not None:
            ids = be.encode_input(flatten_messages([m.model_dump() for m in body.messages]))
        elif isinstance(body.prompt, str):
            ids = be.encode_input(body.prompt)
        elif body.prompt is not None:
            ids = list(body.prompt)
        else:
            raise ApiError("give either prompt or messages", param="prompt")
        return {"count": len(ids), "max_model_len": be.max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        """vLLM's (a development endpoint there): forget every cached block; refused while requests
        hold blocks. Publishes ``AllBlocksCleared`` when KV events are on."""
        if not be.runner.reset_prefix_cache():
            raise ApiError("the prefix cache cannot be reset while requests hold KV blocks", status=409)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> Any:
        card = {
            "id": be.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sagegate",
            "root": settings.engine.model,
            "parent": None,
            "max_model_len": be.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(be.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
