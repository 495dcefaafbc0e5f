"""The simulated backend: an OpenAI-compatible server with vLLM's endpoints and metric names, running
the project's engine model (sim/engine.py) on a real clock, optionally sped up.

Clock. Engine time is ``(loop.time() − t0) × time_scale``. Steps are chained on that clock exactly as
the discrete-event simulator chains them: a step planned at ``s`` ends at ``s + duration`` and the next
one starts there; the loop sleeps until the wall time of each step's end (an absolute deadline), so the
event loop's lateness does not pile up from step to step. Only when the loop falls more than
``max_lag_s`` of wall time behind does engine time jump forward to the wall clock (as a slow GPU would
lose the time). Tokens are delivered when the step that made them ends.

Front end. A request reaches the engine ``perf.frontend_s`` of engine time after the server received
it (tokenisation, HTTP): it waits in a pending list until then, and is admitted by the first step that
starts at or after that time. Arrivals are thus ordered, and a request that arrives during a step joins
the next one — the simulator's rule.

Cancellation. A client that disconnects (streaming: the response is cancelled; non-streaming: the
server sees ``http.disconnect``) aborts its request at once, and the engine frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from policies.base import ENGINE, Policy, SchedRequest, fcfs_tiebreak
from policies.registry import parse_policy
from sim.config import EngineConfig
from sim.engine import ABORTED, FINISHED, Engine, EngineRequest
from sim.hardware import get_gpu, get_model
from sim.perf import PerfModel
from sim.prefix import CHARS_PER_TOKEN
from sim.tokens import encode, flatten_messages

SCHEDULING_POLICIES = ("fcfs", "priority")
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions; used for chat too (vLLM's would fill the context)
FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")

# Histogram buckets (seconds), spaced like vLLM's own.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
# fmt: on


@dataclass(frozen=True)
class BackendSettings:
    """What ``sagegate backend`` is started with."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    time_scale: float = 1.0
    scheduling_policy: str = "fcfs"
    max_lag_s: float = 0.05  # wall seconds the loop may fall behind before engine time jumps ahead

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {self.scheduling_policy!r}; "
                f"valid: {', '.join(SCHEDULING_POLICIES)}"
            )
        if self.max_lag_s < 0:
            raise ValueError("max_lag_s must be >= 0")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.engine.model


class PriorityPolicy(Policy):
    """vLLM's ``--scheduling-policy priority``: lower ``priority`` first, then earlier arrival; the
    preemption victim is the largest such key."""

    name: ClassVar[str] = "priority"
    levels: ClassVar[frozenset[str]] = frozenset({ENGINE})

    def key(self, req: SchedRequest, now: float) -> Any:
        return (req.priority, *fcfs_tiebreak(req))


# ---------------------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, kind: str = "BadRequestError"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind

    def response(self) -> JSONResponse:
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }
        return JSONResponse(body, status_code=self.status)


def _validation_error(exc: ValidationError | RequestValidationError) -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = first.get("msg", "invalid request")
    return ApiError(f"{'.'.join(loc)}: {msg}" if loc else msg, param=loc[0] if loc else None)


# ---------------------------------------------------------------------------------------------- bodies


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    priority: int = 0
    n: int = 1


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None


# ---------------------------------------------------------------------------------------------- engine


class Stream:
    """One request's channel from the engine loop to its HTTP handler: the number of new tokens after
    each step that made some, ``None`` at the end."""

    __slots__ = ("in_engine", "queue", "req", "t_last", "t_receive")

    def __init__(self, req: EngineRequest, t_receive: float) -> None:
        self.req = req
        self.t_receive = t_receive  # engine time the server received the request
        self.t_last = t_receive
        self.in_engine = False
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return self.req.state == FINISHED


class EngineRunner:
    """Drives one :class:`Engine` on the event loop's clock (see the module docstring)."""

    def __init__(self, engine: Engine, settings: BackendSettings, metrics: Metrics) -> None:
        self.engine = engine
        self.scale = settings.time_scale
        self.max_lag = settings.max_lag_s
        self.frontend_s = engine.perf.frontend_s
        self.metrics = metrics
        self.pending: collections.deque[Stream] = collections.deque()  # arrival order = engine order
        self.live: set[Stream] = set()
        self._chain: float | None = None  # engine time the last step ended
        self._next_rid = 0
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    # --- clock ----------------------------------------------------------------------------------
    def start_clock(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._wake = asyncio.Event()

    def now(self) -> float:
        assert self._loop is not None, "the engine loop has not started"
        return (self._loop.time() - self._t0) * self.scale

    def _wall(self, engine_t: float) -> float:
        return self._t0 + engine_t / self.scale

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not running: the engine's waiting queue plus those still in the front end."""
        return self.engine.num_waiting + sum(1 for s in self.pending if s.req.state != ABORTED)

    # --- requests -------------------------------------------------------------------------------
    def submit(self, prompt_tokens: int, output_tokens: int, prompt_key: str | None, priority: int) -> Stream:
        t = self.now()
        rid = self._next_rid
        self._next_rid += 1
        req = EngineRequest(
            rid, t + self.frontend_s, prompt_tokens, output_tokens, prompt=prompt_key, priority=priority
        )
        stream = Stream(req, t)
        req.user = stream
        self.pending.append(stream)
        self.live.add(stream)
        assert self._wake is not None
        self._wake.set()
        return stream

    def cancel(self, stream: Stream) -> None:
        """The client is gone: drop the request; if it holds KV blocks they are freed now."""
        self.live.discard(stream)
        req = stream.req
        if req.state in (FINISHED, ABORTED):
            return
        if stream.in_engine:
            self.engine.abort(req, self.now())
        else:
            req.state = ABORTED  # still in the front end: skipped when its turn comes

    # --- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        eng = self.engine
        loop = self._loop
        wake = self._wake
        assert loop is not None and wake is not None
        while True:
            while self.pending and self.pending[0].req.state == ABORTED:
                self.pending.popleft()
            if not eng.has_work() and not self.pending:
                wake.clear()
                await wake.wait()
                continue
            now = self.now()
            start = self._chain if self._chain is not None else -math.inf
            if not eng.has_work():
                start = max(start, self.pending[0].req.arrival_s)
            start = max(start, now - self.max_lag * self.scale)
            if start > now:  # idle until the next request clears the front end
                await asyncio.sleep(self._wall(start) - loop.time())
                continue
            self._admit_pending(start)
            if not eng.has_work():
                continue
            # horizon=start: one real step at a time (k = 1), never a folded run of decode steps
            step = eng.plan(start, start)
            if not step.scheduled:  # cannot happen for requests that fit the pool; never spin
                wake.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.1)
                continue
            end = start + step.duration
            await asyncio.sleep(max(0.0, self._wall(end) - loop.time()))
            out = eng.complete(step, end)
            self._chain = end
            self._deliver(out.emitted, out.finished, end, step.k)

    def _admit_pending(self, start: float) -> None:
        pending = self.pending
        while pending and pending[0].req.arrival_s <= start:
            stream = pending.popleft()
            if stream.req.state == ABORTED:
                continue
            stream.in_engine = True
            self.engine.add(stream.req, stream.req.arrival_s)

    def _deliver(
        self, emitted: Iterable[EngineRequest], finished: Iterable[EngineRequest], t: float, k: int
    ) -> None:
        m = self.metrics
        for req in emitted:
            stream: Stream = req.user
            if req.generated == k:
                m.ttft.observe(t - stream.t_receive)
            else:
                m.itl.observe(t - stream.t_last)
            stream.t_last = t
            stream.queue.put_nowait(k)
        for req in finished:
            stream = req.user
            m.e2e.observe(t - stream.t_receive)
            stream.queue.put_nowait(None)
            self.live.discard(stream)

    def shutdown(self) -> None:
        """Wake every handler still waiting so the server can stop."""
        for stream in list(self.live):
            stream.queue.put_nowait(None)
        self.live.clear()


# ---------------------------------------------------------------------------------------------- metrics


class Metrics:
    """vLLM's metric names on a registry of this app's own (several servers may share a process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in simulated seconds, front end included.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens in simulated seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in simulated seconds.",
            labels,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.ttft = self._ttft.labels(model_name)
        self.itl = self._itl.labels(model_name)
        self.e2e = self._e2e.labels(model_name)

    def attach(self, runner: EngineRunner, settings: BackendSettings) -> None:
        self.registry.register(_EngineCollector(runner, settings, self.model_name))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, runner: EngineRunner, settings: BackendSettings, model_name: str) -> None:
        self.runner = runner
        self.model_name = model_name
        eng = runner.engine
        cfg = settings.engine
        self.cache_labels = {
            "block_size": str(eng.pool.block_size),
            "num_gpu_blocks": str(eng.pool.num_blocks),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
        }

    def collect(self) -> Iterator[Metric]:
        eng = self.runner.engine
        name = [self.model_name]
        gauges = (
            ("vllm:num_requests_running", "Requests in the running batch.", eng.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", self.runner.num_waiting),
            ("vllm:kv_cache_usage_perc", "Share of KV blocks in use (0..1).", eng.kv_usage),
        )
        for metric, doc, value in gauges:
            g = GaugeMetricFamily(metric, doc, labels=["model_name"])
            g.add_metric(name, float(value))
            yield g
        counters = (
            ("vllm:num_preemptions", "Preemptions by recompute.", eng.num_preemptions),
            ("vllm:prompt_tokens", "Prompt tokens prefilled.", eng.prompt_tokens_total),
            ("vllm:generation_tokens", "Tokens generated.", eng.generation_tokens_total),
        )
        for metric, doc, value in counters:
            c = CounterMetricFamily(metric, doc, labels=["model_name"])
            c.add_metric(name, float(value))
            yield c
        ok = CounterMetricFamily(
            "vllm:request_success", "Requests finished.", labels=["model_name", "finished_reason"]
        )
        ok.add_metric([self.model_name, "length"], float(eng.finished_total))
        yield ok
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "KV cache configuration.", labels=list(self.cache_labels)
        )
        info.add_metric(list(self.cache_labels.values()), 1.0)
        yield info


# ---------------------------------------------------------------------------------------------- the app


@dataclass
class _Prompt:
    tokens: int
    key: str  # token ids packed CHARS_PER_TOKEN characters apiece: exact prefix-cache content keys


def _pack(ids: list[int]) -> str:
    """Token ids as text of exactly ``CHARS_PER_TOKEN`` characters per token, so the engine's
    text-based prefix keys see token content block for block."""
    assert CHARS_PER_TOKEN == 4
    return struct.pack(f"<{len(ids)}I", *ids).decode("latin-1")


class Backend:
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

    def check_common(self, body: _Body) -> int:
        """Checks shared by both generation routes; returns the output length."""
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
        max_tokens = body.max_tokens
        if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if max_tokens < 1:
            raise ApiError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        return max_tokens

    def prompt_of(self, prompt: Any) -> _Prompt:
        """A completion prompt: text, token ids, or a one-element list of either."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ApiError("batched prompts are not supported by the simulated backend", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = encode(prompt)
        else:
            ids = list(prompt)
            bad = next((t for t in ids if not 0 <= t < self.vocab), None)
            if bad is not None:
                raise ApiError(f"token id {bad} is out of vocabulary (< {self.vocab})", param="prompt")
        if not ids:
            raise ApiError("The prompt cannot be empty.", param="prompt")
        return _Prompt(len(ids), _pack(ids))

    def chat_prompt_of(self, messages: list[ChatMessage]) -> _Prompt:
        if not messages:
            raise ApiError("messages must not be empty", param="messages")
        ids = encode(flatten_messages([m.model_dump() for m in messages]))
        return _Prompt(max(1, len(ids)), _pack(ids or [0]))

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
        self, request: Request, body: _Body, prompt: _Prompt, max_tokens: int, chat: bool
    ) -> Any:
        self.check_length(prompt, max_tokens)
        stream = self.runner.submit(prompt.tokens, max_tokens, prompt.key, body.priority)
        shape = _Shape(self.model_name, chat, prompt.tokens)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
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
        return shape.full(stream.req.generated)

    async def _sse(self, stream: Stream, shape: _Shape, usage: bool) -> AsyncIterator[bytes]:
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
                parts = [_event(shape.chunk(None, None))] if opening else []
                for item in items:
                    if item is None:
                        done = True
                        break
                    for _ in range(item):
                        sent += 1
                        last = sent >= stream.req.output_tokens
                        parts.append(_event(shape.chunk(_word(sent - 1), "length" if last else None)))
                if parts:
                    yield b"".join(parts)
            if not stream.finished:
                return  # stopped by a shutdown: end the stream without [DONE]
            if usage:
                yield _event(shape.usage_chunk(sent))
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


def _word(i: int) -> str:
    return " " + FILLER[i % len(FILLER)]


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Shape:
    """OpenAI response bodies for one request (completion or chat)."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int) -> None:
        self.model = model
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        p = self.prompt_tokens
        return {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, n: int) -> dict[str, Any]:
        text = "".join(_word(i) for i in range(n))
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text}
            body = self._head("text_completion")
        choice.update(logprobs=None, finish_reason="length")
        body.update(choices=[choice], usage=self._usage(n))
        return body

    def chunk(self, text: str | None, finish: str | None) -> dict[str, Any]:
        """A token chunk; for chat, ``text=None`` is the opening chunk that names the role."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text}
            body = self._head("text_completion")
        choice.update(logprobs=None, finish_reason=finish)
        body["choices"] = [choice]
        return body

    def usage_chunk(self, n: int) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body.update(choices=[], usage=self._usage(n))
        return body


def create_app(settings: BackendSettings | None = None) -> FastAPI:
    """The simulated backend as an ASGI app. Raises ValueError for a bad model, GPU or engine setting."""
    settings = settings or BackendSettings()
    be = Backend(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        be.runner.start_clock()
        task = asyncio.create_task(be.runner.run(), name="sim-engine-loop")
        try:
            yield
        finally:
            task.cancel()
            be.runner.shutdown()

    app = FastAPI(title="sagegate simulated backend", lifespan=lifespan)
    app.state.backend = be

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

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
            raise _validation_error(exc) from exc

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body: CompletionBody = parse(CompletionBody, await be.read_json(request))
        max_tokens = be.check_common(body)
        return await be.generate(request, body, be.prompt_of(body.prompt), max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body: ChatBody = parse(ChatBody, await be.read_json(request))
        max_tokens = be.check_common(body)
        return await be.generate(request, body, be.chat_prompt_of(body.messages), max_tokens, chat=True)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body: TokenizeBody = parse(TokenizeBody, await be.read_json(request))
        if body.model is not None and body.model != be.model_name:
            raise ApiError(f"The model `{body.model}` does not exist.", param="model")
        if body.messages is not None:
            ids = encode(flatten_messages([m.model_dump() for m in body.messages]))
        elif isinstance(body.prompt, str):
            ids = encode(body.prompt)
        elif body.prompt is not None:
            ids = list(body.prompt)
        else:
            raise ApiError("give either prompt or messages", param="prompt")
        return {"count": len(ids), "max_model_len": be.max_model_len, "tokens": ids, "token_strs": None}

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
