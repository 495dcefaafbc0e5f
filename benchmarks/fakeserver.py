"""A minimal OpenAI-style streaming server on raw asyncio, to test and benchmark the load generator.

It costs almost nothing per request, so what a replay against it measures is the client's own
behaviour: does each request leave on time, are chunks timed and counted, are failures classified.
It answers ``POST /v1/completions`` and ``/v1/chat/completions`` by streaming the forced length
(``sim_output_tokens``, within ``max_tokens``), else ``max_tokens``, chunks
``interval_s`` apart (chunked HTTP/1.1, keep-alive), then the usage and ``[DONE]``; ``GET /v1/models``;
and ``GET /metrics`` with a ``sagegate_queue_depth`` gauge (requests in flight).

Test hooks: ``stall=True`` reads requests and never answers; a prompt starting with ``[reject]``
gets a 429 with ``x-sagegate-reason: queue_full``, ``[fail]`` a 500, ``[cut]`` a stream that stops
without ``[DONE]``, ``[nousage]`` a stream without usage.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sagegate.core.request import FORCED_OUTPUT_FIELD
from sagegate.core.sse import json_event


@dataclass
class Received:
    """One request as the server saw it; ``t`` is ``time.monotonic()`` when its head arrived."""

    t: float
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeServer:
    interval_s: float = 0.0
    stall: bool = False
    first_token_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    port: int = 0
    _server: asyncio.Server | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._connection, host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # a stalled connection whose client left must not be collected
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                t = time.monotonic()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                size = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(size) if size else b""
                body = json.loads(raw) if raw else {}
                self.received.append(Received(t, path, headers, body))
                if method == "GET":
                    await self._get(path, writer)
                elif self.stall:
                    await asyncio.Event().wait()  # never answers
                else:
                    self.in_flight += 1
                    try:
                        keep = await self._generate(path, body, writer)
                    finally:
                        self.in_flight -= 1
                    if not keep:
                        break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _get(self, path: str, writer: asyncio.StreamWriter) -> None:
        if path == "/metrics":
            text = (
                "# HELP sagegate_queue_depth Requests in flight.\n# TYPE sagegate_queue_depth gauge\n"
                f"sagegate_queue_depth {self.in_flight}\n"
            )
            _respond(writer, 200, text.encode(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            _respond(writer, 200, json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode())
        else:
            _respond(writer, 404, b'{"error": {"message": "not found"}}')
        await writer.drain()

    async def _generate(self, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        chat = path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        cap = body.get("max_tokens")
        forced = body.get(FORCED_OUTPUT_FIELD)
        n = int(forced or cap or 16) if cap is None else min(int(forced or cap), int(cap))
        if prompt.startswith("[reject]"):
            _respond(
                writer,
                429,
                b'{"error": {"message": "queue full"}}',
                extra="x-sagegate-reason: queue_full\r\n",
            )
            return True
        if prompt.startswith("[fail]"):
            _respond(writer, 500, b'{"error": {"message": "boom"}}')
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"x-sagegate-predicted-tokens: %d\r\n\r\n" % (2 * n)
        )
        obj = "chat.completion.chunk" if chat else "text_completion"
        if chat:
            _chunk(writer, _event({"object": obj, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        if self.first_token_s:
            await asyncio.sleep(self.first_token_s)
        for i in range(n):
            if prompt.startswith("[cut]") and i == n // 2:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return False
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
            if chat:
                choice["delta"] = {"content": " tok"}
            else:
                choice["text"] = " tok"
            _chunk(writer, _event({"object": obj, "choices": [choice]}))
            if self.interval_s:
                await writer.drain()
                await asyncio.sleep(self.interval_s)
        if not prompt.startswith("[nousage]"):
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n}
            _chunk(writer, _event({"object": obj, "choices": [], "usage": usage}))
        _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    # --- running in a thread (tests) ---------------------------------------------------------------
    def start(self) -> FakeServer:
        """Serve on a background thread with its own event loop; returns once the port is bound."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        """Close every connection, then stop the thread's loop."""
        loop = self._loop
        if loop is None or self._server is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.01)  # transports finish closing

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _event(obj: dict[str, Any]) -> bytes:
    return json_event(obj)


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json", extra: str = ""
) -> None:
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    ).encode()
    writer.write(head + body)


def main() -> None:  # pragma: no cover - used by benchmarks/bench_loadgen.py
    import argparse

    ap = argparse.ArgumentParser(description="fake OpenAI streaming server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--interval-ms", type=float, default=0.0)
    args = ap.parse_args()

    async def run() -> None:
        server = FakeServer(interval_s=args.interval_ms / 1000)
        await server.serve(port=args.port)
        print(server.port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":  # pragma: no cover
    main()
