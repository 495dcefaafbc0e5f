"""OpenAI's API shapes for the simulated backend: request bodies, response bodies and server-sent
event chunks, and errors. No engine and no I/O here."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")


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


def validation_error(exc: ValidationError | RequestValidationError) -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = first.get("msg", "invalid request")
    return ApiError(f"{'.'.join(loc)}: {msg}" if loc else msg, param=loc[0] if loc else None)


# ---------------------------------------------------------------------------------------------- bodies


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    continuous_usage_stats: bool = False
    """With ``include_usage``: every chunk carries the usage so far too (vLLM's option)."""


class GenerationBody(BaseModel):
    """The fields both generation routes (completions, chat) take."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    priority: int = 0
    n: int = 1
    sim_output_tokens: int | None = Field(default=None, ge=1)
    """Generate exactly this many tokens (within ``max_tokens``): the replay's forced length
    (``core.request.FORCED_OUTPUT_FIELD``). Without it the simulated model, which has no EOS, writes
    ``max_tokens``."""


class CompletionBody(GenerationBody):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(GenerationBody):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    continue_final_message: bool = False
    """vLLM's: the last (assistant) message is unfinished; the model writes on from its end."""
    add_generation_prompt: bool = True


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None


# ---------------------------------------------------------------------------------------------- responses


def filler_word(i: int) -> str:
    """The ``i``-th generated token's text: the simulator makes no real text."""
    return " " + FILLER[i % len(FILLER)]


_FILLER_AT = {w: i for i, w in enumerate(FILLER)}


def written_before(text: str) -> int:
    """How many of the simulated model's own tokens ``text`` ends with: the longest suffix that is
    ``filler_word(0) + … + filler_word(m - 1)``. A continuation (a prompt that ends in what the model
    wrote, or a partial assistant message) is written on from there, as a deterministic model would:
    token ``m`` next, and the forced length counts from the response's start. O(m)."""
    best = 0
    run = 0
    expect = -1
    end = len(text)
    while end > 0:
        cut = text.rfind(" ", 0, end)
        if cut < 0:
            break
        k = _FILLER_AT.get(text[cut + 1 : end], -1)
        if k < 0 or (expect >= 0 and k != expect):
            break
        run += 1
        if k == 0:
            best = run
        expect = (k - 1) % len(FILLER)
        end = cut
    return best


class ResponseShape:
    """OpenAI response bodies for one request (completion or chat)."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int, written: int = 0) -> None:
        self.model = model
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.written = written
        """Tokens of this response the prompt already holds (a continuation): the text goes on from them."""
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.running = False
        """Every token chunk carries the usage so far (``stream_options.continuous_usage_stats``)."""

    def _usage(self, completion_tokens: int, cached: int | None) -> dict[str, Any]:
        p = self.prompt_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }
        if cached is not None:  # vLLM's --enable-prompt-tokens-details
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, n: int, cached: int | None = None) -> dict[str, Any]:
        text = "".join(filler_word(self.written + i) for i in range(n))
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text}
            body = self._head("text_completion")
        choice.update(logprobs=None, finish_reason="length")
        body.update(choices=[choice], usage=self._usage(n, cached))
        return body

    def chunk(self, text: str | None, finish: str | None, sent: int = 0) -> dict[str, Any]:
        """A token chunk, the ``sent``-th; for chat, ``text=None`` is the opening chunk that names the
        role. With :attr:`running` it carries the usage so far (``continuous_usage_stats``)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text}
            body = self._head("text_completion")
        choice.update(logprobs=None, finish_reason=finish)
        body["choices"] = [choice]
        if self.running:
            body["usage"] = self._usage(sent, None)
        return body

    def usage_chunk(self, n: int, cached: int | None = None) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body.update(choices=[], usage=self._usage(n, cached))
        return body
