"""``upstream``: the gateway's HTTP client to its backends (``gateway.settings`` holds the rest of the
one settings object and re-exports this)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class UpstreamSettings(BaseModel):
    """The pooled HTTP client to the backends."""

    connect_timeout_s: float = Field(default=3.0, gt=0.0)
    read_timeout_s: float = Field(default=600.0, gt=0.0)
    """Longest silence tolerated from a backend mid-response."""
    max_connections: int = Field(default=1000, ge=1)
    client: Literal["lean", "httpx"] = "lean"
    """``lean``: httpx over the gateway's own HTTP/1.1 transport (``gateway/http1.py``: asyncio and
    httptools, a fraction of httpcore's CPU) for ``http://`` backends; ``httpx``: httpx's own transport
    for all (and the ``HTTP_PROXY`` family of variables, which ``lean`` does not read)."""
    keepalive_s: float = Field(default=2.0, gt=0.0)
    """Idle pooled connections are dropped after this, before the backend's own keep-alive (uvicorn's
    is 5 s) closes them: reusing a connection the server is closing fails before the first byte."""
    max_attempts: int = Field(default=2, ge=1)
    """Tries per request across backends when one fails before sending anything. A request that
    fails with a 5xx (or is dropped before its first byte) on two backends is taken as the cause and
    not tried again, whatever this says (``gateway.blame``)."""
    tenant_retry_rate: float = Field(default=2.0, ge=0.0)
    """Retries per second each tenant may have after failures its own request may have caused (a 5xx,
    a try dropped before its first byte); failures to connect are retried outside this budget."""
    tenant_retry_burst: int = Field(default=20, ge=0)
    """... and at most this many at once. A tenant past its budget gets the first failure's 502."""
    force_usage: bool = True
    """Ask streaming backends for a usage chunk (hidden from clients that did not ask) to learn
    the exact output length."""
    running_usage: bool = True
    """Ask a stream that may be continued elsewhere for the running usage on every chunk
    (``stream_options.continuous_usage_stats``, vLLM's and SGLang's; hidden from clients that did not
    ask), so a continuation knows the tokens behind the text sent. Off for a backend that refuses the
    field: tokens are then counted by chunks (low where the engine holds a token back)."""
    api_key: SecretStr | None = None
    """The key sent to every backend that names none of its own (``backends[].api_key``); a client's own
    ``Authorization`` (the gateway's key) is never forwarded."""
    forward_priority: bool = False
    """Send ``priority`` (minus ``x-priority``) to backends started with ``--scheduling-policy priority``."""
    rank_priority: bool = False
    """Send each request's rank at dispatch as its ``priority`` (``policies.engine_priority``: its
    priority band first, then the policy's rank bucketed on a log scale), so an engine in
    vLLM's priority mode orders its waiting queue and picks preemption victims by predicted cost.
    Only useful for backends started with ``--scheduling-policy priority`` (an FCFS vLLM ignores the
    field; vLLM 0.32 accepts it without error, some earlier versions refused a non-zero one)."""
    max_sse_event_bytes: int = Field(default=1024 * 1024, ge=4096)
    """Largest SSE event accepted from a backend (a token event is well under 1 KB). A backend that
    sends more without ending an event has its stream ended with an SSE error event."""
