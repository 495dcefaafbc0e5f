"""A lean HTTP/1.1 transport under httpx for plain-HTTP backends: an asyncio protocol per connection
and httptools' C parser, in place of httpcore's anyio streams, h11 and socket polling.

Why: with ``--predictor none`` httpcore was about half of the gateway's own CPU per request (py-spy).
httpx stays above it (requests, responses, errors, timeouts are httpx's), so nothing that
sends through the client changes.

Invariants:
- a connection carries one request at a time; it goes back to the pool only when its response ended
  whole and both sides said keep-alive, and its stream was closed; anything else closes it;
- a pooled connection the server has closed is known from the event loop's callback and never reused;
  one idle for ``keepalive_s`` is closed instead of reused (before the backend's own keep-alive, uvicorn's
  5 s, can close it under a request);
- at most ``max_connections`` are open; a request past that waits for one (an idle one of another
  origin is closed to make room);
- the body arrives as the backend sent it: every chunk received since the reader last asked is handed
  over joined (one event-loop turn for a burst); reading pauses past ``HIGH_WATER`` unread bytes;
- interim (1xx) answers are skipped; bytes arriving on an idle connection close it; a pool wait
  honours httpx's ``pool`` timeout (:class:`httpx.PoolTimeout`);
- no HEAD (refused: the parser cannot be told such an answer has no body), no upgrades, no proxies, no
  TLS (``https://`` is left to httpx's own transport, see :func:`gateway.upstream.upstream_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, TypeVar, cast

import httptools
import httpx

HIGH_WATER = 1 << 18
"""Unread body bytes past which the connection stops reading (TCP pushes back on the backend)."""

Origin = tuple[str, int]
T = TypeVar("T")


class _Body(httpx.AsyncByteStream):
    """A response body as it arrives; closing it returns or closes its connection."""

    def __init__(self, conn: _Conn, read_timeout: float | None) -> None:
        self.conn = conn
        self.read_timeout = read_timeout
        self.chunks: list[bytes] = []
        self.size = 0
        self.done = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False

    # -- fed by the connection ----------------------------------------------------------------------
    def push(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER:
            self.conn.pause()
        self._wake()

    def finish(self, error: Exception | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error
            self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- read by httpx ------------------------------------------------------------------------------
    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            if self.chunks:
                chunks = self.chunks
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self.chunks, self.size = [], 0
                self.conn.resume()
                yield data
            elif self.done:
                if self.error is not None:
                    raise self.error
                return
            else:
                await self._wait()

    async def _wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await _within(self.waiter, self.read_timeout, self.conn.request)
        finally:
            self.waiter = None

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        conn = self.conn
        if self.done and self.error is None and conn.keep_alive and not conn.paused:
            conn.pool.release(conn)
        else:
            conn.close()


async def _within(fut: asyncio.Future[T], timeout: float | None, request: httpx.Request | None) -> T:
    """``fut``'s result, or :class:`httpx.ReadTimeout` after ``timeout`` seconds: one timer handle,
    cheaper than ``asyncio.timeout`` on every wait for a chunk."""
    timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, _expire, fut, request)
    try:
        return await fut
    finally:
        if timer is not None:
            timer.cancel()


def _expire(waiter: asyncio.Future[Any], request: httpx.Request | None) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("the backend sent nothing in time", request=request))


class _Conn(asyncio.Protocol):
    """One connection to a backend and the response it is receiving."""

    def __init__(self, pool: Http1Transport, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.request: httpx.Request | None = None
        self.head: asyncio.Future[int] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: _Body | None = None
        self.keep_alive = False
        self.until_eof = False
        self.interim = False
        self.version = b"HTTP/1.1"
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes on an idle connection (an unasked 408, a stray tail): unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response: {exc}", request=self.request))
            self.close()

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        head = self.head
        answered = head is not None and head.done()
        if self.body is not None and self.until_eof and answered and exc is None:
            self.body.finish()  # a body without a length ends with the connection
        else:
            why = "without answering" if head is not None and not answered else "mid-response"
            self._fail(
                httpx.RemoteProtocolError(f"the backend closed the connection {why}", request=self.request)
            )
        self._forget()

    # -- httptools callbacks --------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103): the real one follows
            self.interim, self.headers = True, []
            return
        self.version = b"HTTP/" + self.parser.get_http_version().encode()
        sized = chunked = False
        for name, value in self.headers:
            low = name.lower()
            sized = sized or low == b"content-length"
            chunked = chunked or (low == b"transfer-encoding" and b"chunked" in value.lower())
        self.until_eof = not sized and not chunked and status not in (204, 304)
        head = self.head
        if head is not None and not head.done():
            head.set_result(status)

    def on_body(self, body: bytes) -> None:
        if self.body is not None:
            self.body.push(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()
        if self.body is not None:
            self.body.finish()

    # -- the connection's life ------------------------------------------------------------------------
    def _fail(self, error: Exception) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        if self.body is not None:
            self.body.finish(error)

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._forget()

    def _forget(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)

    async def exchange(
        self, request: httpx.Request, wire: bytes, read_timeout: float | None
    ) -> httpx.Response:
        """Send ``wire`` (the whole request) and wait for the response's head."""
        if self.closed or self.transport is None:
            raise httpx.RemoteProtocolError(
                "the connection closed before the request was sent", request=request
            )
        loop = asyncio.get_running_loop()
        self.request, self.headers, self.keep_alive = request, [], False
        self.until_eof = self.interim = False
        head = self.head = loop.create_future()
        body = self.body = _Body(self, read_timeout)
        self.transport.write(wire)
        try:
            status = await _within(head, read_timeout, request)
        except BaseException:
            self.close()
            raise
        return httpx.Response(
            status, headers=self.headers, stream=body, extensions={"http_version": self.version}
        )


class Http1Transport(httpx.AsyncBaseTransport):
    """Pooled HTTP/1.1 connections over asyncio (see the module's invariants)."""

    def __init__(self, *, max_connections: int = 1000, keepalive_s: float = 2.0) -> None:
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.idle: dict[Origin, list[_Conn]] = {}
        self.open: set[_Conn] = set()
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if request.method == "HEAD":  # the parser cannot be told such an answer has no body
            raise httpx.UnsupportedProtocol("HEAD is not served by this transport", request=request)
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"{url.scheme}:// is not served by this transport", request=request
            )
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            content = request.content
        except httpx.RequestNotRead:
            content = await request.aread()
        target = url.raw_path
        head = [request.method.encode(), b" ", target, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        if "transfer-encoding" in request.headers:  # a streamed body, read whole: sent as one chunk
            content = b"%x\r\n%s\r\n0\r\n\r\n" % (len(content), content) if content else b"0\r\n\r\n"
        wire = b"".join(head) + content
        origin = (url.host, url.port or 80)
        conn = await self._acquire(origin, request, timeouts.get("connect"), timeouts.get("pool"))
        return await conn.exchange(request, wire, timeouts.get("read"))

    async def _acquire(
        self,
        origin: Origin,
        request: httpx.Request,
        connect_timeout: float | None,
        pool_timeout: float | None,
    ) -> _Conn:
        loop = asyncio.get_running_loop()
        while True:
            conn = self._reuse(origin, loop.time())
            if conn is not None:
                return conn
            if len(self.open) < self.max_connections or self._evict_idle():
                break
            waiter = loop.create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(pool_timeout):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the free slot goes to the next in line
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout("no connection came free in time", request=request) from None
                raise
        conn = _Conn(self, origin)
        self.open.add(conn)
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(lambda: conn, origin[0], origin[1])
        except TimeoutError:
            conn.close()
            raise httpx.ConnectTimeout(
                f"connecting to {origin[0]}:{origin[1]} timed out", request=request
            ) from None
        except OSError as exc:
            conn.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        except BaseException:
            conn.close()
            raise
        if conn.closed:  # the transport was closed (``aclose``) while this one connected
            conn.close()
            raise httpx.ConnectError("the transport closed while connecting", request=request)
        return conn

    def _reuse(self, origin: Origin, now: float) -> _Conn | None:
        idle = self.idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    def _evict_idle(self) -> bool:
        """Close the longest-idle connection of any origin; False when none is idle."""
        oldest: _Conn | None = None
        for idle in self.idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self.idle[oldest.origin].remove(oldest)
        oldest.close()
        return True

    def release(self, conn: _Conn) -> None:
        """A connection whose response ended whole: back to its origin's idle stack."""
        if conn.closed:
            return
        conn.request = conn.head = conn.body = None
        now = conn.idle_since = asyncio.get_running_loop().time()
        idle = self.idle.setdefault(conn.origin, [])
        while idle and now - idle[0].idle_since >= self.keepalive_s:  # the stalest first
            idle.pop(0).close()
        idle.append(conn)
        self._wake()

    def forget(self, conn: _Conn) -> None:
        """A connection closed (by either side): its slot is free."""
        self.open.discard(conn)
        idle = self.idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake()

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.idle.clear()
