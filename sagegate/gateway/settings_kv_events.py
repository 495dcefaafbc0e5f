"""The settings of precise cache-aware placement: where a backend publishes its KV-cache events
(``backends[].kv_events``) and how the gateway follows them (``placement.kv_events``), both read by
``gateway.kv_events``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator


class BackendKVEvents(BaseModel):
    """Where a backend publishes its KV-cache events (vLLM's ``--kv-events-config``): the gateway
    subscribes and follows exactly what the engine caches (``gateway.kv_events``: precise placement)."""

    endpoint: str
    """The engine's ZMQ PUB socket, as the gateway reaches it: ``tcp://gpu-1:5557`` for vLLM's
    ``"endpoint": "tcp://*:5557"``."""
    replay_endpoint: str | None = None
    """Its ROUTER replay socket (vLLM's ``replay_endpoint``), asked for missed batches after a gap."""
    topic: str = ""
    """Subscribe to topics starting with this (vLLM's ``topic``; empty: all)."""
    block_size: int | None = Field(default=None, ge=1, le=4096)
    """The engine's KV block size; unset: from its events, else its ``vllm:cache_config_info``."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith(("tcp://", "ipc://", "inproc://")) or "*" in v):
            raise ValueError(
                f"KV events endpoint {v!r} must be a tcp://host:port (or ipc://) address to connect to"
            )
        return v


class KVEventsSettings(BaseModel):
    """How the gateway follows backends' KV-cache events (``gateway.kv_events``); which backends
    publish them is each backend's ``kv_events``."""

    tokenizer: Literal["local", "backend"] = "local"
    """How a request's prompt becomes the token ids its engine caches: ``local``, the gateway's BPE
    (``cl100k_base``) over chat messages as ``role: content`` lines, as the simulated backend does;
    ``backend``, the backend's own ``POST /tokenize`` (a real vLLM: its model's tokenizer and chat
    template; one round trip per request, while some backend is precise)."""
    tokenize_timeout_s: float = Field(default=1.0, gt=0.0)
    """``tokenizer: backend``: the longest wait; then the request is placed by the approximate index."""
    stale_s: float = Field(default=10.0, gt=0.0)
    """Requests went to a backend this long ago and no event came since: its events have stopped,
    and it is placed by the approximate index until one comes."""
    resync_s: float = Field(default=30.0, ge=0.0)
    """After a gap in the sequence that replay could not fill, the exact index is cleared and rebuilt
    from the events that follow; the approximate index places for this long meanwhile."""
    replay_timeout_s: float = Field(default=1.0, gt=0.0)
    """The longest wait for the replay socket's answer."""
    max_replay_batches: int = Field(default=10_000, ge=0)
    """A longer gap is not replayed (cleared and rebuilt instead)."""
    max_message_bytes: int = Field(default=1 << 20, ge=1024)
    """A longer message is refused (ZMQ's ``MAXMSGSIZE`` closes the connection; the gateway opens a new
    one at once, counts ``dropped{why="connection"}``, and the batches lost are a gap): the memory and
    the work one message costs the event loop stay bounded (about 40 ms a MiB). vLLM's batches are one
    engine step's changes: tens of kB (a step computes at most ``max_num_batched_tokens``)."""
    receive_hwm: int = Field(default=10_000, ge=1)
    """Messages queued unread at most (ZMQ's ``RCVHWM``); past it they are lost, and seen as a gap."""
