"""The lean HTTP/1.1 transport under httpx, against raw asyncio servers on loopback that misbehave on
purpose: connections reused only while sound, bodies handed over as they arrive, every failure an httpx
error, and every slot freed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest

from sagegate.gateway.http1 import HIGH_WATER, Http1Transport
from tests.gateway_support import until

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run[Any]:
    """Runs a coroutine on asyncio's own loop or on uvloop's (the served gateway's)."""
    factory = None
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory = uvloop.new_event_loop

    def go(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    return go


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    """Counts connections; ``handler`` answers each request (it may loop for keep-alive)."""

    handler: Handler
    connections: int = 0
    open_now: int = 0
    peak: int = 0
    eofs: int = 0
    bodies: list[bytes] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.peak = max(self.peak, self.open_now)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            with contextlib.suppress(Exception):
                writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request (head and a Content-Length body); False at the client's EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.eofs += 1
            return False
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        self.bodies.append(await reader.readexactly(length))
        return True


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    srv = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = srv.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        srv.close()


def client(transport: Http1Transport, read: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(mounts={"http://": transport}, timeout=httpx.Timeout(read, connect=2.0))


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
    while await s.request(reader):
        writer.write(ok(b"hello %d" % len(s.bodies[-1])))
        await writer.drain()


def test_sequential_requests_reuse_one_connection_and_carry_their_bodies(run: Run[Any]) -> None:
    async def scenario() -> tuple[list[str], Server, int]:
        async with serving(keep_alive) as s:
            t = Http1Transport()
            async with client(t) as c:
                url = f"http://127.0.0.1:{s.port}/v1/x?a=1"
                texts = [(await c.post(url, content=b"x" * n)).text for n in (0, 5, 70_000)]
                return texts, s, len(t.open)

    texts, s, still_open = run(scenario())
    assert texts == ["hello 0", "hello 5", "hello 70000"]
    assert s.connections == 1 and [len(b) for b in s.bodies] == [0, 5, 70_000]
    assert still_open == 1  # the one idle connection, closed with the client


def test_a_stream_reaches_the_reader_before_the_backend_finishes(run: Run[Any]) -> None:
    first_seen = asyncio.Event()

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst \r\n")
        await writer.drain()
        await asyncio.wait_for(first_seen.wait(), 5)  # a transport that waits for the whole body deadlocks
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")
        await writer.drain()
        await s.request(reader)

    async def scenario() -> list[bytes]:
        async with serving(drip) as s, client(Http1Transport()) as c:
            got = []
            async with c.stream("POST", f"http://127.0.0.1:{s.port}/", content=b"{}") as resp:
                async for chunk in resp.aiter_raw():
                    got.append(chunk)
                    first_seen.set()
            return got

    assert run(scenario()) == [b"first ", b"last"]


def test_a_connection_the_backend_closed_while_idle_is_not_reused(run: Run[Any]) -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        writer.write(ok(b"once"))  # says keep-alive (HTTP/1.1), then closes: its keep-alive ran out
        await writer.drain()

    async def scenario() -> tuple[list[int], Server]:
        t = Http1Transport()
        async with serving(one_then_close) as s, client(t) as c:
            url = f"http://127.0.0.1:{s.port}/"
            codes = [(await c.get(url)).status_code]
            await until(lambda: not t.open, "the close reaches the pool")
            codes.append((await c.get(url)).status_code)
            return codes, s

    codes, s = run(scenario())
    assert codes == [200, 200] and s.connections == 2


def test_a_connection_idle_past_keepalive_is_closed_not_reused(run: Run[Any]) -> None:
    async def scenario() -> tuple[Server, int]:
        async with serving(keep_alive) as s, client(Http1Transport(keepalive_s=0.02)) as c:
            url = f"http://127.0.0.1:{s.port}/"
            await c.get(url)
            await asyncio.sleep(0.04)  # idle past the keep-alive (the loop's clock: never shorter)
            await c.get(url)
            await until(lambda: s.eofs >= 1, "the stale connection's close reaches the server")
            return s, s.eofs

    s, eofs = run(scenario())
    assert s.connections == 2 and eofs >= 1  # the stale one was closed by the client


def test_a_refused_connection_is_a_connect_error_and_holds_no_slot(run: Run[Any]) -> None:
    async def scenario() -> int:
        t = Http1Transport(max_connections=1)
        async with client(t) as c:
            for _ in range(3):  # a leaked slot would make the second wait for ever
                with pytest.raises(httpx.ConnectError):
                    await asyncio.wait_for(c.get("http://127.0.0.1:9/"), 5)
            return len(t.open)

    assert run(scenario()) == 0


def test_silence_before_the_head_or_mid_body_is_a_read_timeout(run: Run[Any]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        if len(s.bodies) % 2 == 0:  # the second request: a head and part of the body, then nothing
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
            await writer.drain()
        await reader.read()  # silent until the client gives up and closes

    async def scenario() -> tuple[type[Exception], type[Exception], int]:
        t = Http1Transport()
        async with serving(silent) as s, client(t, read=0.2) as c:
            url = f"http://127.0.0.1:{s.port}/"
            with pytest.raises(httpx.ReadTimeout) as before:
                await c.get(url)
            with pytest.raises(httpx.ReadTimeout) as during:
                await c.get(url)
            return before.type, during.type, len(t.open)

    before, during, still_open = run(scenario())
    assert before is httpx.ReadTimeout and during is httpx.ReadTimeout and still_open == 0


def test_a_backend_dying_mid_body_is_a_protocol_error_and_frees_the_slot(run: Run[Any]) -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b")
        await writer.drain()

    async def answers_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)

    async def scenario() -> int:
        t = Http1Transport()
        async with client(t) as c:
            for handler in (dies, answers_nothing):
                async with serving(handler) as s:
                    with pytest.raises(httpx.RemoteProtocolError):
                        await asyncio.wait_for(c.get(f"http://127.0.0.1:{s.port}/"), 5)
            return len(t.open)

    assert run(scenario()) == 0


def test_closing_a_stream_early_closes_its_connection(run: Run[Any]) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        if not await s.request(reader):
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"5\r\ntoken\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async def scenario() -> tuple[int, int, int]:
        t = Http1Transport()
        async with serving(endless) as s, client(t) as c:
            url = f"http://127.0.0.1:{s.port}/"
            for _ in range(2):
                async with c.stream("GET", url) as resp:
                    async for _chunk in resp.aiter_raw():
                        break
            await until(lambda: s.open_now == 0, "the server sees both closes")
            return s.connections, s.open_now, len(t.open)

    assert run(scenario()) == (2, 0, 0)


def test_requests_past_the_limit_wait_for_a_connection(run: Run[Any]) -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        while await s.request(reader):
            await asyncio.sleep(0.03)
            writer.write(ok(b"done"))
            await writer.drain()

    async def scenario() -> tuple[list[str], Server]:
        async with serving(slow) as s, client(Http1Transport(max_connections=2)) as c:
            url = f"http://127.0.0.1:{s.port}/"
            answers = await asyncio.wait_for(asyncio.gather(*(c.get(url) for _ in range(8))), 10)
            return [a.text for a in answers], s

    texts, s = run(scenario())
    assert texts == ["done"] * 8 and s.peak == 2 and s.connections == 2


def test_connection_close_and_unlengthed_bodies_end_the_connection(run: Run[Any]) -> None:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        if len(s.bodies) == 1:
            writer.write(ok(b"bye", b"connection: close\r\n"))
        else:  # no length, no chunks: the body is what comes before the close
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def scenario() -> tuple[list[str], int]:
        async with serving(closing) as s, client(Http1Transport()) as c:
            url = f"http://127.0.0.1:{s.port}/"
            return [(await c.get(url)).text, (await c.get(url)).text], s.connections

    texts, connections = run(scenario())
    assert texts == ["bye", "until the end"] and connections == 2


def test_a_large_body_is_read_whole_through_back_pressure(run: Run[Any]) -> None:
    size = 3 * (1 << 20)

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        writer.write(ok(bytes(range(256)) * (size // 256)))
        await writer.drain()

    async def scenario() -> bytes:
        parts = []
        async with (
            serving(large) as s,
            client(Http1Transport()) as c,
            c.stream("GET", f"http://127.0.0.1:{s.port}/") as resp,
        ):
            async for chunk in resp.aiter_raw():
                parts.append(chunk)
                await asyncio.sleep(0)  # a slow reader: the transport pauses and resumes
        return b"".join(parts)

    assert run(scenario()) == bytes(range(256)) * (size // 256)


def test_an_empty_answer_then_a_close_before_answering_fails_at_once(run: Run[Any]) -> None:
    """A 204 has no length; the connection goes back to the pool. If the backend then closes it under
    the next request, that request fails at once (it is not read as a body ending with the close)."""

    async def no_content_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server
    ) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        await s.request(reader)  # the second request arrives; no answer, the connection closes

    async def scenario() -> tuple[int, float]:
        async with serving(no_content_then_close) as s, client(Http1Transport(), read=5.0) as c:
            url = f"http://127.0.0.1:{s.port}/"
            first = (await c.get(url)).status_code
            started = time.monotonic()
            with pytest.raises(httpx.RemoteProtocolError):
                await c.get(url)
            return first, time.monotonic() - started

    first, waited = run(scenario())
    assert first == 204 and waited < 2.0  # not the 5 s read timeout


def test_interim_answers_are_skipped(run: Run[Any]) -> None:
    async def continues(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        while await s.request(reader):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"answer %d" % len(s.bodies)))
            await writer.drain()

    async def scenario() -> list[tuple[int, bytes]]:
        async with serving(continues) as s, client(Http1Transport()) as c:
            url = f"http://127.0.0.1:{s.port}/"
            return [((r := await c.get(url)).status_code, r.content) for _ in range(2)]

    assert run(scenario()) == [(200, b"answer 1"), (200, b"answer 2")]


def test_a_connection_closed_with_a_paused_unread_body_is_not_pooled(run: Run[Any]) -> None:
    async def large_then_small(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        while await s.request(reader):
            writer.write(ok(b"x" * (HIGH_WATER + 4096) if len(s.bodies) == 1 else b"small"))
            await writer.drain()

    async def scenario() -> tuple[bytes, int]:
        t = Http1Transport()
        async with serving(large_then_small) as s, client(t, read=2.0) as c:
            url = f"http://127.0.0.1:{s.port}/"
            async with c.stream("GET", url):
                (conn,) = t.open
                # the body arrives, past the high-water mark, unread: reading paused
                await until(lambda: conn.paused, "the connection paused")
            return (await c.get(url)).content, s.connections

    assert run(scenario()) == (b"small", 2)


def test_a_wait_for_a_connection_honours_the_pool_timeout(run: Run[Any]) -> None:
    async def holds(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Server) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()  # holds it until the client closes

    async def scenario() -> float:
        async with serving(holds) as s, client(Http1Transport(max_connections=1)) as c:
            url = f"http://127.0.0.1:{s.port}/"
            async with c.stream("GET", url):  # holds the only connection
                started = time.monotonic()
                with pytest.raises(httpx.PoolTimeout):
                    await c.get(url, timeout=httpx.Timeout(5.0, pool=0.3))
                return time.monotonic() - started

    assert run(scenario()) < 2.0


def test_head_is_refused(run: Run[Any]) -> None:
    async def scenario() -> None:
        async with client(Http1Transport()) as c:
            with pytest.raises(httpx.UnsupportedProtocol):
                await c.head("http://127.0.0.1:9/")

    run(scenario())
