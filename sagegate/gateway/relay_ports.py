"""The relay's two narrow interfaces, so that its modules import each other in one direction only
(``proxy`` → ``stream`` → ``resume`` → here):

- :class:`RelayHost`: what a relayed stream and its resumer use of the proxy that opened it (send a
  try, read its first chunk, settle the request, the pool, the dispatcher, the settings);
- :class:`Relay`: what a resumer reads of the stream it keeps going, and what it hands over when a
  resumed try answers (:meth:`Relay.switch`).

And :class:`Failed`, what a try that failed before its first byte says, which both sides read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from sagegate.core.outcomes import Outcome
from sagegate.core.predictor import Asked
from sagegate.gateway.backends import Backend, BackendPool
from sagegate.gateway.blame import Suspect
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.lifecycle import Lifecycle
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.sse import SseScanner
from sagegate.gateway.upstream import Upstream


@dataclass(slots=True)
class Failed:
    """Why one try failed before the first byte; ``retry_after`` is set when the backend said 429.
    ``suspect``: the request may be the cause (see ``gateway.blame``); the backend is not charged
    until the request's next try gives the verdict."""

    why: str
    throttled: bool = False
    retry_after: str | None = None
    suspect: Suspect | None = None


class RelayHost(Protocol):
    """The proxy, as a relayed stream sees it (``gateway.proxy.Proxy``)."""

    settings: GatewaySettings
    dispatcher: Dispatcher
    pool: BackendPool
    client: Upstream
    metrics: GatewayMetrics
    closing: bool
    """The gateway is ending what is still running."""
    streams: set[Any]
    """The streams being relayed (a stream adds itself, and removes itself when it stops)."""

    def scanner(self, req: GatewayRequest) -> SseScanner: ...

    async def send(self, lc: Lifecycle, b: Backend, stream: bool) -> httpx.Response | Failed: ...

    async def first_chunk(
        self, lc: Lifecycle, b: Backend, resp: httpx.Response
    ) -> tuple[AsyncIterator[bytes], bytes] | Failed: ...

    def answered(self, lc: Lifecycle, b: Backend, *, first_token: bool = True) -> None: ...

    def plausible(self, req: GatewayRequest, b: Backend, usage: object) -> int | None: ...

    def settle(
        self, lc: Lifecycle, asked: Asked, outcome: Outcome, output: int | None, status: int = 200
    ) -> None: ...


class Relay(Protocol):
    """A relayed stream, as its resumer sees it (``gateway.stream.SseResponse``)."""

    proxy: RelayHost
    lc: Lifecycle
    req: GatewayRequest
    backend: Backend
    scanner: SseScanner
    reader: asyncio.Task[None] | None
    """The task reading the current try (None until the stream is handed to it)."""
    aborted: str | None
    stopping: bool
    """The relay is ending: no pause may start now."""
    blame_backend: bool

    def end(self, data: bytes, outcome: Outcome, why: str = "", event: bytes | None = None) -> None:
        """Queue the stream's end (with an SSE error event unless it ended well), then settle."""
        ...

    def switch(self, b: Backend, upstream: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
        """A resumed try on ``b`` has answered: the stream relays from it now (a fresh scanner)."""
        ...

    async def read(self, first: bytes = b"") -> None:
        """Relay the current try, ``first`` and then its chunks, until it ends (the reader task)."""
        ...
