"""``limits``: what a client may ask for and how long it may take (``gateway.settings`` holds the rest
of the one settings object)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LimitSettings(BaseModel):
    """What a client may ask for."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_tokens: int = Field(default=32_768, ge=1)
    """Largest ``max_tokens`` (or ``max_completion_tokens``) accepted."""
    max_n: int = Field(default=1, ge=1)
    header_timeout_s: float = Field(default=10.0, gt=0.0)
    """A client must send a request's whole head (request line and headers) within this long of
    starting it (or of connecting); else ``408`` and the connection is closed."""
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request head; a longer one gets ``431`` and the connection is closed."""
    body_timeout_s: float = Field(default=30.0, gt=0.0)
    """A client must send a request's whole body within this long of its head; else ``408``."""
    max_relay_buffer_bytes: int = Field(default=1024 * 1024, ge=4096)
    """How far a streaming client may fall behind its backend (bytes relayed but not yet taken by the
    client's connection). Past it the client loses its stream and the backend request is cancelled:
    a client that stops reading never holds a backend or unbounded memory."""
    max_connections: int | None = Field(default=None, ge=1)
    """Open client connections (and requests) at most, beyond which uvicorn answers ``503``
    (``limit_concurrency``). Off by default: the queue bounds requests and the timeouts above bound
    idle sockets; set it below the process's file-descriptor limit."""
    keep_alive_s: float = Field(default=75.0, gt=0.0)
    """How long an idle client connection stays open for its next request (uvicorn's
    ``timeout_keep_alive``, 5 s by default). Longer than common client pools keep idle connections
    (aiohttp 15 s, httpx 5 s, Go 90 s is the exception): a server that closes a pooled connection
    just as the client reuses it fails that request with no status (measured at uvicorn's 5 s:
    14 of 750 requests from a pool idling 4.9-5.1 s)."""
    max_json_depth: int = Field(default=64, ge=2, le=500)
    """Deepest nesting of arrays and objects a body may have (``400`` beyond): OpenAI bodies, tool
    schemas included, rarely pass 20; the bound keeps parsing off Python's recursion limit."""
