"""The OpenAI request bodies the gateway reads, and its error bodies.

Only the fields the gateway acts on are declared; everything else a client sends is kept
(``extra="allow"``) and passed to the backend untouched. The models double as the OpenAPI schema.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    user: str | None = None


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Common):
    """``POST /v1/completions``. One prompt: a string, or a list of token ids."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    """OpenAI's error shape, used for every error the gateway answers itself."""

    error: ErrorDetail


class Route(StrEnum):
    """The two generation endpoints; the value is the ``route`` metric label."""

    CHAT = "chat"
    COMPLETIONS = "completions"


OpenAIRequest = ChatCompletionRequest | CompletionRequest
