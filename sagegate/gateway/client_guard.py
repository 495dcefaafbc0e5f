"""Bounds on client connections, for ``sagegate serve``: how long a client may take to send a request's
head and body, how large the head may be, how many connections may be open.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``, set from
``limits.keep_alive_s``, above common client pools' idle times): a client that sends
half a head, or half a body, holds its socket and task for ever. The head is guarded in the HTTP
protocol (a timer from the connection, or from a request's first byte, to its last header: ``408``
and the connection closed); the body in an ASGI wrapper around the app (``receive`` under a
deadline: the request is answered ``408`` through the gateway's own error handler). How far a
streaming client may fall behind is bounded in the relay (``gateway.stream.SseResponse``), which drops
a client past it through :data:`CLIENT_ABORT`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from sagegate.core.outcomes import Reason
from sagegate.gateway import errors
from sagegate.gateway.settings import GatewaySettings, LimitSettings

DRAIN_GRACE_S = 1.0
"""uvicorn's own shutdown timeout runs this long past ``drain_timeout_s``: the gateway ends what is
left at the drain deadline itself (SSE error events, 503s), and uvicorn cancels only what that missed."""


CLIENT_ABORT: ContextVar[Callable[[], None] | None] = ContextVar("sagegate_client_abort", default=None)
"""Drops the current request's client connection at once (no flush). Set by the protocol before it
starts a request's task, so the task (which copies the context) sees its own connection's."""


class ConnectionEvent(StrEnum):
    """Why the gateway closed, or lost, a client connection (``sagegate_client_connections_closed``)."""

    IDLE = "idle"
    """No request on it for ``limits.keep_alive_s``: closed (a client reusing it just then fails)."""
    LOST_MID_REQUEST = "lost_mid_request"
    """The client's side closed while a request on it was unanswered (a cancel, or a network loss)."""
    HEAD_TIMEOUT = "head_timeout"
    HEAD_TOO_LARGE = "head_too_large"


def _ignore(event: ConnectionEvent) -> None:
    pass


class _HeadGuard:
    """Mixed into uvicorn's HTTP protocol (httptools or h11): bounds the time and size of a head, and
    reports every connection it closes or loses with a request on it (``on_event``)."""

    head_timeout_s = 10.0
    max_head_bytes = 64 * 1024
    on_event: Callable[[ConnectionEvent], None] = staticmethod(_ignore)
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    _tail = b""
    """The last bytes of the head so far: its end (``\\r\\n\\r\\n``) may straddle two reads."""

    # the protocol's own attributes, as this mixin uses them
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self.on_event(ConnectionEvent.LOST_MID_REQUEST)
        super().connection_lost(exc)  # type: ignore[misc]

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.on_event(ConnectionEvent.IDLE)
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head():
            if self._head_timer is None:
                self._arm_head()
            # The head's size is checked on every read, up to its end if this read holds it: a head
            # that arrives whole in one read is bounded too.
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            head = self._head_bytes + (len(data) if end < 0 else end + 4 - len(self._tail))
            if head > self.max_head_bytes:
                message = f"the request head exceeds {self.max_head_bytes} bytes"
                self._refuse(431, Reason.REQUEST_HEADER_TOO_LARGE, message)
                return
            self._head_bytes += len(data)
            self._tail = seen[-3:]
            CLIENT_ABORT.set(self.transport.abort)
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing() or not self._awaiting_head():
            self._disarm_head()

    def _awaiting_head(self) -> bool:
        cycle = self.cycle
        return cycle is None or bool(cycle.response_complete)

    def _arm_head(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)
        self._head_bytes = 0
        self._tail = b""

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_bytes = 0
        self._tail = b""

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        if self._head_bytes:
            self._refuse(408, Reason.REQUEST_TIMEOUT, f"the request head took over {self.head_timeout_s:g} s")
        else:
            self.on_event(ConnectionEvent.IDLE)
            self.transport.close()  # connected and said nothing

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._disarm_head()
        self.on_event(ConnectionEvent.HEAD_TIMEOUT if status == 408 else ConnectionEvent.HEAD_TOO_LARGE)
        body = json.dumps(errors.GatewayError(status, message, reason=reason).body()).encode()
        phrase = b"Request Timeout" if status == 408 else b"Request Header Fields Too Large"
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status,
            phrase,
            len(body),
        )
        self.transport.write(head + b"connection: close\r\n\r\n" + body)
        self.transport.close()


def guarded_protocol(
    limits: LimitSettings, on_event: Callable[[ConnectionEvent], None] = _ignore
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with the head bounds of ``limits``,
    reporting closed and lost connections to ``on_event``."""
    attrs = {
        "head_timeout_s": limits.header_timeout_s,
        "max_head_bytes": limits.max_header_bytes,
        "on_event": staticmethod(on_event),
    }
    return type("GuardedHTTPProtocol", (_HeadGuard, AutoHTTPProtocol), attrs)


class BodyDeadline:
    """ASGI wrapper: a request's body must arrive within ``timeout_s`` of its head, else ``408``.

    The deadline is on ``receive`` while the body is incomplete, so it surfaces in the handler reading
    the body as a :class:`GatewayError`, answered by the app's own error handler; the answer closes the
    connection (the rest of the body will not be read).
    """

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        complete = False

        async def guarded_receive() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                complete = True
                raise errors.timeout(f"the request body took over {self.timeout_s:g} s") from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, guarded_receive, send)


def uvicorn_options(
    settings: GatewaySettings, on_event: Callable[[ConnectionEvent], None] = _ignore
) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that carry the client bounds, the keep-alive and
    the drain."""
    limits = settings.limits
    return {
        "http": guarded_protocol(limits, on_event),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "limit_concurrency": limits.max_connections,
        "timeout_keep_alive": limits.keep_alive_s,
        "timeout_graceful_shutdown": settings.drain_timeout_s + DRAIN_GRACE_S,
    }
