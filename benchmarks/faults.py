"""The fault suite: the gateway's fault matrix against a live stack on loopback, one Markdown table.

    .venv/bin/python -m benchmarks faults            # the full matrix (~10 min here)
    .venv/bin/python -m benchmarks faults --quick    # the same faults, smaller (~4 min)
    .venv/bin/python -m benchmarks faults --only fuzz,drain

The stack: a private ``redis-server``, two simulated backends (``sagegate backend``, small KV pools,
high ``--time-scale``), the gateway (``sagegate serve`` with its defaults: ``sagesched``, the semantic
predictor, its history in that Redis), and for the bad-backend row a second gateway in front of a fake
misbehaving server (this file, ``bad-backend``; a real process). Every part is its own process.

The ``poison`` rows (issue 35): one tenant sends 4 poison requests every 1.5 s while another sends
ordinary ones at 4/s; ``poison`` sends 2 MB prompts to the simulated backends (which answer 400, as
vLLM does), ``poison_500`` a prompt that a pair of fake backends answers 500 (an engine build that
crashes on one input), behind a third gateway. The victim must keep >= 99%, no circuit may open.
``idle_pool``: pooled clients idling 4.9-5.1 s between requests, through the gateway and straight to a
backend side by side (the server's keep-alive racing the pool's).

Per fault: requests **sent**; **answered** (200, and a stream that ended with ``[DONE]`` and no error
event); **errored** by status (an HTTP status, ``sse_error`` for a stream that ended with an error
event, ``cancelled`` for a request this client cut on purpose, ``refused`` for a connection refused
while the gateway drains, ``closed`` for a slow socket the gateway closed); **lost** = sent − answered
− errored (a transport error, a truncated stream, a timeout, a slow socket still held open: must be 0);
**leaked** reservations (requests still queued or in flight per ``/admin/queue`` once all traffic has
ended: must be 0); the p99 latency of the answered requests; notes (what was lost, gateway log errors).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import select
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from sagegate.harness.live import backend_args
from sagegate.harness.procs import Child, child, free_port
from sagegate.harness.redis import RedisServer

MODEL = "llama-3.1-8b"
POISON = "POISON-INPUT"
TWO_MB_PROMPT = "hello world " * 180_000
"""A prompt the simulated backend's tokenizer refuses (it answered 500 until issue 35; vLLM says 400)."""
ADMIN = "faults-admin"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
]


# --- outcomes -------------------------------------------------------------------------------------
@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    errored: Counter[str] = field(default_factory=Counter)
    lost_kinds: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.sent - self.answered - sum(self.errored.values())

    def ok(self, t0: float) -> None:
        self.answered += 1
        self.latencies.append(time.monotonic() - t0)

    def p99_ms(self) -> str:
        if not self.latencies:
            return "-"
        xs = sorted(self.latencies)
        return f"{1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.0f}"


@dataclass
class Row:
    fault: str
    tally: Tally
    leaked: str
    notes: list[str]


def body(rng: random.Random, max_tokens: Sequence[int], stream_share: float = 0.7) -> dict[str, Any]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 400)))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": rng.choice(max_tokens),
        "stream": rng.random() < stream_share,
    }


async def call(
    client: httpx.AsyncClient,
    url: str,
    req: dict[str, Any],
    tally: Tally,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> None:
    """One request; its outcome goes into ``tally`` (a cancellation is the caller's to count)."""
    tally.sent += 1
    t0 = time.monotonic()
    try:
        if not req.get("stream"):
            r = await client.post(url + "/v1/chat/completions", json=req, timeout=timeout, headers=headers)
            if r.status_code == 200:
                tally.ok(t0)
            else:
                tally.errored[str(r.status_code)] += 1
            return
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=req, timeout=timeout, headers=headers
        ) as r:
            if r.status_code != 200:
                await r.aread()
                tally.errored[str(r.status_code)] += 1
                return
            tail, error = b"", False
            async for chunk in r.aiter_bytes():
                seen = tail + chunk
                error = error or b'data: {"error"' in seen
                tail = seen[-64:]
        if error:
            tally.errored["sse_error"] += 1
        elif b"[DONE]" in tail:
            tally.ok(t0)
        else:
            tally.lost_kinds["truncated stream"] += 1
    except httpx.ConnectError:
        tally.errored["refused"] += 1  # nothing was accepted: the caller sees it at once
    except httpx.TimeoutException as exc:
        tally.lost_kinds[f"timeout ({type(exc).__name__})"] += 1
    except httpx.HTTPError as exc:
        tally.lost_kinds[type(exc).__name__] += 1


async def open_loop(
    client: httpx.AsyncClient,
    url: str,
    reqs: Sequence[dict[str, Any]],
    rate: float,
    tally: Tally,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = []
    for i, req in enumerate(reqs):
        delay = t0 + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(call(client, url, req, tally, timeout, headers)))
    await asyncio.gather(*tasks)


async def closed_loop(
    client: httpx.AsyncClient, url: str, reqs: Sequence[dict[str, Any]], workers: int, tally: Tally
) -> float:
    """``reqs`` through ``workers`` concurrent clients; returns the answered rate (requests/s)."""
    todo = list(reqs)
    t0 = time.monotonic()

    async def worker() -> None:
        while todo:
            await call(client, url, todo.pop(), tally, 60)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return tally.answered / max(1e-9, time.monotonic() - t0)


# --- the stack ------------------------------------------------------------------------------------
def admin_state(url: str) -> dict[str, Any] | None:
    try:
        r = httpx.get(url + "/admin/queue", headers={"authorization": f"Bearer {ADMIN}"}, timeout=5)
        out: dict[str, Any] = r.json()
        return out
    except (httpx.HTTPError, ValueError):
        return None


def leaked(url: str, timeout: float = 30.0) -> str:
    """Requests still queued or in flight once traffic has ended (waits up to ``timeout`` for zero)."""
    deadline = time.monotonic() + timeout
    while True:
        snap = admin_state(url)
        if snap is not None:
            inflight = sum(b["inflight"] for b in snap["backends"])
            reserved = sum(b["reserved_tokens"] for b in snap["backends"])
            if snap["queued"] == 0 and inflight == 0 and reserved == 0:
                return "0"
            if time.monotonic() > deadline:
                return f"{snap['queued'] + inflight} ({reserved} KV tokens)"
        elif time.monotonic() > deadline:
            return "unreadable"
        time.sleep(0.2)


def healthy(url: str, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = admin_state(url)
        if snap is not None and sum(b["healthy"] for b in snap["backends"]) >= n:
            return
        time.sleep(0.2)
    print(f"(note: fewer than {n} healthy backends after {timeout:g} s)", file=sys.stderr)


@contextlib.contextmanager
def sim_backend(blocks: int, time_scale: float, port: int | None = None) -> Iterator[Child]:
    args = [*backend_args(MODEL, "h100", time_scale), "--num-gpu-blocks-override", str(blocks)]
    with child("sagegate.cmd_backend", args, port=port) as c:
        yield c


@contextlib.contextmanager
def gateway(settings: dict[str, Any], port: int | None = None) -> Iterator[Child]:
    cfg = {"admin_key": ADMIN, "log_level": "warning", **settings}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        with child(
            "sagegate.cli", ["serve", "--config", f.name], port=port, ready_path="/ready",
            startup_timeout_s=240, env=env,
        ) as c:  # fmt: skip
            yield c
    finally:
        os.unlink(f.name)


class LogWatch:
    """New ERROR lines and tracebacks in a child's stderr since the last look."""

    def __init__(self, c: Child) -> None:
        self.child, self.at = c, 0

    def since(self) -> str:
        log = self.child.log
        log.flush()
        log.seek(self.at)
        text = log.read()
        self.at = log.tell()
        errors = sum(" ERROR " in line or line.startswith("ERROR") for line in text.splitlines())
        tracebacks = text.count("Traceback (most recent call last)")
        return f"gateway log: {errors} ERROR, {tracebacks} tracebacks" if errors or tracebacks else ""


# --- the faults -----------------------------------------------------------------------------------
@dataclass
class Size:
    baseline: int
    kill: int
    redis: int
    disconnects: int
    overload_s: float
    fuzz_mutations: int
    slow_headers: int
    slow_bodies: int
    stalled: int
    slow_hold_s: float
    bad_each: int
    drain: int
    max_tokens: tuple[int, ...]
    poison_s: float = 12.0
    idle_users: int = 20
    idle_rounds: int = 5


QUICK = Size(60, 120, 120, 300, 5.0, 60, 30, 10, 3, 8.0, 4, 30, (16, 64, 128, 256, 600))
FULL = Size(
    300, 400, 400, 1000, 10.0, 300, 300, 100, 10, 40.0, 20, 100, (16, 64, 256, 600, 1000, 3000), 30.0, 50, 15
)


class Suite:
    def __init__(self, size: Size, seed: int, blocks: int, time_scale: float) -> None:
        self.size, self.blocks, self.time_scale = size, blocks, time_scale
        self.rng = random.Random(seed)
        self.capacity_rps = 20.0
        self.gateway_pid = 0

    def reqs(self, n: int, stream_share: float = 0.7) -> list[dict[str, Any]]:
        return [body(self.rng, self.size.max_tokens, stream_share) for _ in range(n)]

    async def baseline(self, gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        self.capacity_rps = await closed_loop(client, gw, self.reqs(self.size.baseline), 32, tally)
        return tally, [f"closed loop, 32 clients: {self.capacity_rps:.1f} answered/s"]

    async def backend_kill(
        self, gw: str, client: httpx.AsyncClient, victim: Child
    ) -> tuple[Tally, list[str]]:
        tally = Tally()
        n = self.size.kill
        rate = max(10.0, 0.8 * self.capacity_rps)

        async def kill() -> None:
            await asyncio.sleep(0.4 * n / rate)
            victim.proc.kill()

        await asyncio.gather(open_loop(client, gw, self.reqs(n), rate, tally, 120), kill())
        return tally, [f"{n} at {rate:.0f}/s; backend-1 SIGKILLed {0.4 * n / rate:.1f} s in"]

    async def redis_restart(
        self, gw: str, client: httpx.AsyncClient, redis: RedisServer
    ) -> tuple[Tally, list[str]]:
        tally = Tally()
        n = self.size.redis
        rate = max(10.0, 0.8 * self.capacity_rps)

        async def bounce() -> None:
            await asyncio.sleep(0.3 * n / rate)
            redis.kill()
            await asyncio.sleep(0.3 * n / rate)
            await asyncio.to_thread(redis.start)

        await asyncio.gather(open_loop(client, gw, self.reqs(n), rate, tally, 120), bounce())
        await asyncio.sleep(3.0)  # the history store's backoff (≤ 1 s) and re-seed
        return tally, [history_note(redis)]

    async def disconnects(self, gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        n = self.size.disconnects

        async def cut(req: dict[str, Any]) -> None:
            task = asyncio.ensure_future(call(client, gw, req, tally, 60))
            await asyncio.sleep(self.rng.uniform(0.0, 0.6))
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                tally.errored["cancelled"] += 1

        tasks = []
        for req in self.reqs(n, stream_share=0.8):
            tasks.append(asyncio.create_task(cut(req)))
            await asyncio.sleep(1 / 200)
        await asyncio.gather(*tasks)
        await closed_loop(client, gw, self.reqs(20), 4, tally)  # the gateway still serves
        return tally, [f"{n} cut after 0-600 ms (queued or mid-stream), then 20 served"]

    async def overload(self, gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        rate = 10 * self.capacity_rps
        n = int(rate * self.size.overload_s)
        rss0 = rss_mb(self.gateway_pid)
        await open_loop(client, gw, self.reqs(n), rate, tally, 180)
        rss = f"gateway RSS {rss0:.0f} -> {rss_mb(self.gateway_pid):.0f} MB"
        return tally, [f"{n} at {rate:.0f}/s (10x the baseline's rate) for {self.size.overload_s:g} s; {rss}"]

    async def fuzz(self, gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        cases = malformed() + [mutate(self.rng) for _ in range(self.size.fuzz_mutations)]
        sem = asyncio.Semaphore(16)
        fives: list[str] = []

        async def send(method: str, path: str, raw: bytes, headers: dict[str, str]) -> None:
            async with sem:
                tally.sent += 1
                t0 = time.monotonic()
                try:
                    r = await client.request(method, gw + path, content=raw, headers=headers, timeout=30)
                except httpx.HTTPError as exc:
                    tally.lost_kinds[type(exc).__name__] += 1
                    return
                if r.status_code == 200:
                    tally.ok(t0)
                else:
                    tally.errored[str(r.status_code)] += 1
                    if r.status_code >= 500:
                        fives.append(raw[:60].decode("utf-8", "replace"))

        await asyncio.gather(*(send(*c) for c in cases))
        notes = [f"{len(cases)} bodies ({len(cases) - self.size.fuzz_mutations} crafted, the rest mutated)"]
        if fives:
            notes.append(f"5xx for e.g. {fives[0]!r}")
        return tally, notes

    async def slow_clients(self, gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        s = self.size
        host, port = "127.0.0.1", int(gw.rsplit(":", 1)[1])
        tally = Tally()
        socks: list[tuple[str, socket.socket]] = []
        for _ in range(s.slow_headers):
            socks.append(("header", _open(host, port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")))
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        for _ in range(s.slow_bodies):
            socks.append(("body", _open(host, port, head + b'content-length: 4000\r\n\r\n{"model":')))
        for _ in range(s.stalled):
            raw = json.dumps({**body(self.rng, (3000,)), "stream": True}).encode()
            req = head + f"content-length: {len(raw)}\r\n\r\n".encode() + raw
            sock = _open(host, port, req, rcvbuf=4096)
            socks.append(("stalled", sock))
        tally.sent += len(socks)
        normal = Tally()
        await open_loop(client, gw, self.reqs(30), 10, normal, 60)
        await asyncio.sleep(max(0.0, s.slow_hold_s - 3.0))
        kinds: Counter[str] = Counter()
        held = [sock for kind, sock in socks if kind != "stalled"]
        outcomes = dict(zip(map(id, held), _settle_slow(held), strict=True))
        stalled = [sock for kind, sock in socks if kind == "stalled"]
        read = await asyncio.gather(*(asyncio.to_thread(_settle_stalled, sock) for sock in stalled))
        outcomes.update(zip(map(id, stalled), read, strict=True))
        for kind, sock in socks:
            outcome = outcomes[id(sock)]
            kinds[f"{kind}:{outcome}"] += 1
            if outcome == "answered":
                tally.answered += 1
            elif outcome in ("closed", "cut") or outcome.isdigit():
                tally.errored[outcome] += 1
            else:
                tally.lost_kinds[f"{kind} {outcome}"] += 1
        tally.sent += normal.sent
        tally.answered += normal.answered
        tally.errored.update(normal.errored)
        tally.lost_kinds.update(normal.lost_kinds)
        tally.latencies = normal.latencies
        detail = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        return tally, [f"sockets held {s.slow_hold_s:g} s ({detail}); 30 normal requests alongside"]

    async def bad_backends(self, bad_gw: str, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        notes = []
        for mode in ("429", "die", "negative"):
            for stream in (False, True):
                for _ in range(self.size.bad_each):
                    req = {**body(self.rng, (32,)), "model": f"bad-{mode}", "stream": stream}
                    await call(client, bad_gw, req, tally, 30)
        health_ms: list[float] = []

        async def probe() -> None:
            while True:
                t0 = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    await client.get(bad_gw + "/health", timeout=30)
                health_ms.append(1000 * (time.monotonic() - t0))
                await asyncio.sleep(0.2)

        prober = asyncio.create_task(probe())
        endless = {**body(self.rng, (32,)), "model": "bad-endless", "stream": True}
        await call(client, bad_gw, endless, tally, 15)
        prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await prober
        notes.append(
            f"429, mid-stream death, negative usage x{2 * self.size.bad_each} each; one endless event"
        )
        if health_ms:
            notes.append(f"/health during the endless event: max {max(health_ms):.0f} ms")
        total = _metric(bad_gw, "sagegate_actual_output_tokens_sum")
        if total is not None and total < 0:
            notes.append(f"negative usage reached the metrics (sum {total:.0f})")
        return tally, notes

    async def poison(
        self, gw: str, client: httpx.AsyncClient, text: str, model: str
    ) -> tuple[Tally, list[str]]:
        """One tenant sends 4 poison requests every 1.5 s (``text`` in the prompt) while another sends
        ordinary requests at 4/s; the fleet's circuits and readiness are watched throughout."""
        tally, victim, attacker = Tally(), Tally(), Tally()
        opened: set[str] = set()
        not_ready = 0
        stop = asyncio.Event()

        async def watch() -> None:
            nonlocal not_ready
            while not stop.is_set():
                snap = await asyncio.to_thread(admin_state, gw)
                for b in (snap or {}).get("backends", []):
                    if b.get("circuit_open"):
                        opened.add(str(b.get("name")))
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(gw + "/ready", timeout=5)).status_code != 200:
                        not_ready += 1
                await asyncio.sleep(0.2)

        def req(content: str) -> dict[str, Any]:
            return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16}

        async def attack() -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + self.size.poison_s
            tasks = []
            while loop.time() < end:
                for _ in range(4):
                    poisoned = req(text)
                    tasks.append(call(client, gw, poisoned, attacker, 60, {"x-tenant": "attacker"}))
                await asyncio.sleep(1.5)
            await asyncio.gather(*tasks)

        n_victim = int(4 * self.size.poison_s)
        victims = [req(" ".join(self.rng.choice(WORDS) for _ in range(30))) for _ in range(n_victim)]
        watcher = asyncio.create_task(watch())
        with contextlib.suppress(Exception):
            await asyncio.gather(
                attack(), open_loop(client, gw, victims, 4.0, victim, 60, {"x-tenant": "victim"})
            )
        stop.set()
        await watcher
        for part in (victim, attacker):
            tally.sent += part.sent
            tally.answered += part.answered
            tally.errored.update(part.errored)
            tally.lost_kinds.update(part.lost_kinds)
        tally.latencies = victim.latencies
        statuses = ", ".join(f"{k} x{v}" for k, v in sorted(attacker.errored.items())) or "none refused"
        notes = [
            f"victim {victim.answered}/{victim.sent} answered ({100 * victim.answered / max(1, victim.sent):.1f}%)",
            f"attacker: {attacker.sent} sent, {statuses}",
            f"circuits opened: {', '.join(sorted(opened)) or 'none'}; /ready not ready in {not_ready} samples",
        ]
        return tally, notes

    async def idle_pool(self, gw: str, backend: str) -> tuple[Tally, list[str]]:
        """Pooled clients (httpx's defaults) idling 4.9-5.1 s between requests, the same load through
        the gateway and straight to a backend, side by side: the server's keep-alive races the pool's."""
        tallies = {"gateway": Tally(), "backend": Tally()}

        async def user(url: str, tally: Tally, client: httpx.AsyncClient, rng: random.Random) -> None:
            for _ in range(self.size.idle_rounds):
                await call(client, url, {**body(rng, (16,)), "stream": False}, tally, 60)
                await asyncio.sleep(rng.uniform(4.9, 5.1))

        async def users(name: str, url: str) -> None:
            async with httpx.AsyncClient(trust_env=False) as pooled:
                rngs = [random.Random(self.rng.random()) for _ in range(self.size.idle_users)]
                await asyncio.gather(*(user(url, tallies[name], pooled, r) for r in rngs))

        await asyncio.gather(users("gateway", gw), users("backend", backend))
        g, b = tallies["gateway"], tallies["backend"]
        idle = _metric(gw, 'sagegate_client_connections_closed_total{why="idle"}') or 0
        lost = _metric(gw, 'sagegate_client_connections_closed_total{why="lost_mid_request"}') or 0
        notes = [
            f"{self.size.idle_users} pooled users x {self.size.idle_rounds} requests, 4.9-5.1 s apart",
            f"straight to a backend: {b.sent - b.answered} of {b.sent} failed ({dict(b.lost_kinds) or 'none'})",
            f"gateway counted {idle:.0f} idle closes, {lost:.0f} connections lost mid-request",
        ]
        return g, notes

    async def drain(self, gw: Child, client: httpx.AsyncClient) -> tuple[Tally, list[str]]:
        tally = Tally()
        n = self.size.drain
        reqs = [{**r, "stream": True, "max_tokens": 400} for r in self.reqs(n)]
        tasks = [asyncio.create_task(call(client, gw.url, r, tally, 120)) for r in reqs]
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        gw.proc.terminate()
        await asyncio.sleep(0.3)
        late = self.reqs(10)
        await asyncio.gather(*(call(client, gw.url, r, tally, 30) for r in late))
        await asyncio.gather(*tasks)
        code = await asyncio.to_thread(gw.proc.wait, 60)
        took = time.monotonic() - t0
        return tally, [f"SIGTERM with {n} streams in flight, then 10 more; exit {code} after {took:.1f} s"]


def _open(host: str, port: int, data: bytes, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, port))
    sock.sendall(data)
    return sock


def _settle_slow(socks: Sequence[socket.socket]) -> list[str]:
    """What became of each half-sent request: ``closed`` (or the HTTP status it got) if the gateway
    gave up on it, ``held open`` if it still waits (looked at all at once, 0.5 s)."""
    readable, _, _ = select.select(socks, [], [], 0.5) if socks else ([], [], [])
    ready = set(map(id, readable))
    out = []
    for sock in socks:
        outcome = "held open"
        if id(sock) in ready:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            status = data.split(b" ", 2)[1:2]
            outcome = status[0].decode() if status and status[0].isdigit() else "closed"
        sock.close()
        out.append(outcome)
    return out


def _settle_stalled(sock: socket.socket) -> str:
    """A client that stopped reading, reading now: ``answered`` (the whole stream was kept for it),
    ``cut`` (the gateway ended it), or ``stalled after reading`` (neither within 20 s: lost)."""
    sock.settimeout(20)
    buf = b""
    try:
        while chunk := sock.recv(65536):
            buf = buf[-200:] + chunk
            if b"data: [DONE]" in buf:
                return "answered"
    except TimeoutError:
        return "stalled after reading"
    except OSError:
        return "cut"
    finally:
        sock.close()
    return "cut"


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux), MB; 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _metric(url: str, name: str) -> float | None:
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def history_note(redis: RedisServer) -> str:
    """Entries in the gateway's history stream against distinct completion ids (duplicates show)."""
    import redis as redis_py

    r = redis_py.Redis(port=redis.port, socket_timeout=5)
    try:
        entries = ids = 0
        for key in r.scan_iter("*:stream"):
            rows: Any = r.xrange(key)
            entries += len(rows)
            ids += len({fields.get(b"id") for _, fields in rows})
        return f"history after the restart: {entries} entries, {ids} distinct ids"
    except redis_py.RedisError as exc:
        return f"history unreadable: {exc}"
    finally:
        r.close()


def malformed() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """Crafted bad requests: (method, path, body, headers)."""
    j = {"content-type": "application/json"}
    ok = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def enc(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    deep = b'{"model":"m","messages":[],"x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    cases: list[tuple[str, str, bytes, dict[str, str]]] = [
        ("POST", "/v1/chat/completions", b"", j),
        ("POST", "/v1/chat/completions", b"{", j),
        ("POST", "/v1/chat/completions", b"[]", j),
        ("POST", "/v1/chat/completions", b"null", j),
        ("POST", "/v1/chat/completions", b"\xff\xfe\x00garbage", j),
        ("POST", "/v1/chat/completions", deep, j),
        ("POST", "/v1/chat/completions", enc(ok).replace(b"4}", b"NaN}"), j),
        ("POST", "/v1/chat/completions", enc(ok).replace(b"4}", b"Infinity}"), j),
        ("POST", "/v1/chat/completions", enc({**ok, "max_tokens": "4"}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "max_tokens": -1}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "max_tokens": 10**12}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "n": 5}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "messages": "hi"}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "messages": [{"role": 5}]}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "model": "no-such-model"}), j),
        ("POST", "/v1/chat/completions", enc({**ok, "stream_options": {"include_usage": True}}), j),
        ("POST", "/v1/chat/completions", enc({k: v for k, v in ok.items() if k != "model"}), j),
        ("POST", "/v1/chat/completions", b'{"model":"' + b"x" * (5 << 20) + b'"}', j),
        ("POST", "/v1/chat/completions", enc(ok), {**j, "x-priority": "high"}),
        ("POST", "/v1/chat/completions", enc(ok), {**j, "x-deadline-ms": "-5"}),
        ("POST", "/v1/chat/completions", enc(ok), {**j, "content-length": "99999999999"}),
        ("POST", "/v1/completions", enc({"model": MODEL, "prompt": ["a", "b"]}), j),
        ("POST", "/v1/completions", enc({"model": MODEL, "prompt": [[1, 2], [3]]}), j),
        ("POST", "/v1/completions", enc({"model": MODEL, "prompt": {"a": 1}}), j),
        ("GET", "/v1/chat/completions", b"", {}),
        ("PUT", "/v1/models", b"", {}),
        ("GET", "/admin/queue?limit=abc", b"", {"authorization": f"Bearer {ADMIN}"}),
        ("GET", "/admin/queue", b"", {"authorization": "Bearer wrong"}),
        ("GET", "/no/such/route", b"", {}),
        ("POST", "/v1/chat/completions", enc(ok), {"content-type": "text/plain"}),
        ("POST", "/v1/chat/completions", enc(ok), j),  # a valid one in the mix
    ]
    return [c for c in cases if not (c[3].get("content-length") and len(c[2]) < 1000)] + [
        ("POST", "/v1/chat/completions", enc(ok), {**j, "x-tenant": "t" * 10_000})
    ]


def mutate(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    """A valid body with a few random bytes flipped, cut or inserted."""
    raw = bytearray(json.dumps(body(rng, (8,), 0.5)).encode())
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(raw))
        op = rng.random()
        if op < 0.4:
            raw[at] = rng.randrange(256)
        elif op < 0.7:
            del raw[at : at + rng.randint(1, 20)]
        else:
            raw[at:at] = rng.choice([b"[", b"{", b'"', b"\\", b"\x00", b"NaN", b"1e999", b"\xc3"])
    return ("POST", "/v1/chat/completions", bytes(raw), {"content-type": "application/json"})


# --- the misbehaving backend (its own process: ``python -m benchmarks.faults bad-backend``) --------
def bad_backend_app() -> Any:
    """A vLLM-like server that misbehaves by model: ``bad-429`` (429 with retry-after: 7),
    ``bad-die`` (dies after five chunks), ``bad-negative`` (negative usage), ``bad-endless`` (one SSE
    event that never ends), ``bad-poison`` (500 for a prompt holding ``POISON``, as an engine build
    that crashes on one input; other prompts answered)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    models = ["bad-429", "bad-die", "bad-negative", "bad-endless", "bad-poison"]

    def chunk(i: int) -> bytes:
        delta = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
        return (
            b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", **delta}).encode() + b"\n\n"
        )

    usage = {"prompt_tokens": 3, "completion_tokens": -1_000_000, "total_tokens": -999_997}

    async def stream(mode: str) -> AsyncIterator[bytes]:
        if mode == "endless":
            yield b'data: {"id": "c", "choices": [{"delta": {"content": "'
            while True:
                yield b"x" * 65536
                await asyncio.sleep(0.001)
        for i in range(8):
            if mode == "die" and i == 5:
                raise RuntimeError("dying mid-stream")
            yield chunk(i)
            await asyncio.sleep(0.005)
        yield b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def generate(request: Request) -> Response:
        req = await request.json()
        mode = str(req.get("model", "")).removeprefix("bad-")
        if mode == "429":
            err = {"error": {"message": "slow down", "type": "rate_limit_error", "code": 429}}
            return JSONResponse(err, status_code=429, headers={"retry-after": "7"})
        if mode == "poison":
            if POISON in json.dumps(req.get("messages")):
                err = {"message": "engine error on this input", "type": "InternalServerError", "code": 500}
                return JSONResponse({"error": err}, status_code=500)
            good = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
            msg = {"role": "assistant", "content": "x"}
            return JSONResponse({"id": "c", "object": "chat.completion", "model": req.get("model"),
                                 "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                 "usage": good})  # fmt: skip
        if req.get("stream"):
            return StreamingResponse(stream(mode), media_type="text/event-stream")
        if mode == "die":
            raise RuntimeError("dying before the body")
        msg = {"role": "assistant", "content": "x"}
        return JSONResponse({"id": "c", "object": "chat.completion", "model": req.get("model"),
                             "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                             "usage": usage})  # fmt: skip

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

    async def health(request: Request) -> Response:
        return Response("ok")

    async def metrics(request: Request) -> Response:
        return Response('vllm:num_requests_waiting{model_name="bad"} 0\n'
                        'vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"} 1.0\n')  # fmt: skip

    return Starlette(
        routes=[
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/models", list_models),
            Route("/health", health),
            Route("/metrics", metrics),
        ]
    )


def serve_bad_backend(host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(bad_backend_app(), host=host, port=port, log_level="critical")


# --- the run --------------------------------------------------------------------------------------
FAULTS = ("baseline", "backend_kill", "redis_restart", "disconnects", "overload", "fuzz", "slow_clients",
          "bad_backends", "poison", "idle_pool", "drain")  # fmt: skip


async def run_suite(size: Size, only: set[str], seed: int, blocks: int, time_scale: float) -> list[Row]:
    suite = Suite(size, seed, blocks, time_scale)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    redis = RedisServer(binary, free_port())
    redis.start()
    rows: list[Row] = []
    # No keep-alive: a pooled connection the server closes just as a request reuses it fails on the
    # client side (a race of HTTP/1.1, not a loss by the gateway); a connection per request has none.
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=0)
    settings = {
        "redis_url": redis.url,
        "queue": {"max_wait_s": 5.0, "max_requests": 1000},
        "health": {"probe_interval_s": 0.5, "open_s": 1.0},
        "drain_timeout_s": 30,
        # Client bounds shorter than the slow-client row's hold, so every held socket is answered
        # (408) or closed within it; the defaults (10 s, 30 s) are documented in docs/gateway.md.
        "limits": {"header_timeout_s": 2.0, "body_timeout_s": 3.0},
    }
    try:
        with contextlib.ExitStack() as stack:
            b0 = stack.enter_context(sim_backend(blocks, time_scale))
            b1_port = free_port()
            b1 = stack.enter_context(sim_backend(blocks, time_scale, b1_port))
            print("starting the gateway (loads the embedding model) ...", file=sys.stderr)
            gw = stack.enter_context(gateway({**settings, "backends": [b0.url, b1.url]}))
            watch = LogWatch(gw)
            suite.gateway_pid = gw.proc.pid
            async with httpx.AsyncClient(limits=limits, trust_env=False) as client:

                async def record(
                    name: str, go: Callable[[], Awaitable[tuple[Tally, list[str]]]], gate: str | None = None
                ) -> None:
                    if (gate or name) not in only:
                        return
                    print(f"fault: {name} ...", file=sys.stderr)
                    t0 = time.monotonic()
                    tally, notes = await go()
                    leak = await asyncio.to_thread(leaked, gw.url) if name != "drain" else "n/a (exited)"
                    log_note = watch.since()
                    notes = notes + ([log_note] if log_note else [])
                    if tally.lost_kinds:
                        notes.append("lost: " + ", ".join(f"{v} {k}" for k, v in tally.lost_kinds.items()))
                    rows.append(Row(name, tally, leak, notes))
                    print(f"  done in {time.monotonic() - t0:.1f} s", file=sys.stderr)

                await record("baseline", lambda: suite.baseline(gw.url, client))
                await record("backend_kill", lambda: suite.backend_kill(gw.url, client, b1))
                if "backend_kill" in only:  # bring it back on its port for the rows after
                    stack.enter_context(sim_backend(blocks, time_scale, b1_port))
                    await asyncio.to_thread(healthy, gw.url, 2)
                await record("redis_restart", lambda: suite.redis_restart(gw.url, client, redis))
                await record("disconnects", lambda: suite.disconnects(gw.url, client))
                await record("overload", lambda: suite.overload(gw.url, client))
                await record("fuzz", lambda: suite.fuzz(gw.url, client))
                await record("slow_clients", lambda: suite.slow_clients(gw.url, client))
                if "bad_backends" in only:
                    bad = stack.enter_context(child("benchmarks.faults", ["bad-backend"]))
                    bad_gw = stack.enter_context(
                        gateway({"backends": [bad.url], "predictor": "none", "queue": {"max_wait_s": 5.0}})
                    )
                    bad_watch = LogWatch(bad_gw)

                    async def bad_row() -> tuple[Tally, list[str]]:
                        tally, notes = await suite.bad_backends(bad_gw.url, client)
                        leak = await asyncio.to_thread(leaked, bad_gw.url)
                        extra = bad_watch.since()
                        return tally, notes + [f"bad gateway leaked {leak}"] + ([extra] if extra else [])

                    await record("bad_backends", bad_row)
                if "poison" in only:
                    await record("poison", lambda: suite.poison(gw.url, client, TWO_MB_PROMPT, MODEL))
                    pair = [
                        stack.enter_context(child("benchmarks.faults", ["bad-backend"])) for _ in range(2)
                    ]
                    pair_gw = stack.enter_context(
                        gateway(
                            {
                                "backends": [b.url for b in pair],
                                "predictor": "none",
                                "queue": {"max_wait_s": 5.0},
                            }
                        )
                    )

                    async def pair_row() -> tuple[Tally, list[str]]:
                        tally, notes = await suite.poison(pair_gw.url, client, POISON, "bad-poison")
                        leak = await asyncio.to_thread(leaked, pair_gw.url)
                        return tally, notes + [f"the pair's gateway leaked {leak}"]

                    await record("poison_500", pair_row, gate="poison")
                await record("idle_pool", lambda: suite.idle_pool(gw.url, b0.url))
                await record("drain", lambda: suite.drain(gw, client))
    finally:
        redis.kill()
    return rows


def table(rows: Sequence[Row]) -> str:
    out = [
        "| fault | sent | answered | errored by status | lost | leaked | p99 served (ms) | notes |",
        "|---|---:|---:|---|---:|---|---:|---|",
    ]
    for r in rows:
        t = r.tally
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(t.errored.items())) or "-"
        out.append(
            f"| {r.fault} | {t.sent} | {t.answered} | {errs} | {t.lost} | {r.leaked} | {t.p99_ms()} | "
            f"{'; '.join(r.notes)} |"
        )
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "bad-backend":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("--host", default="127.0.0.1")
        ap.add_argument("--port", type=int, required=True)
        a = ap.parse_args()
        serve_bad_backend(a.host, a.port)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts (a few minutes)")
    ap.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=2000, help="KV blocks per simulated backend (16 tokens)")
    ap.add_argument("--time-scale", type=float, default=20.0, help="engine seconds per wall second")
    a = ap.parse_args()
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    unknown = only - set(FAULTS)
    if unknown:
        raise SystemExit(f"unknown faults {sorted(unknown)}; valid: {', '.join(FAULTS)}")
    t0 = time.monotonic()
    rows = asyncio.run(run_suite(QUICK if a.quick else FULL, only, a.seed, a.blocks, a.time_scale))
    print(table(rows))
    print(f"\n({'quick' if a.quick else 'full'} run, {time.monotonic() - t0:.0f} s)")
    bad = [r.fault for r in rows if r.tally.lost or r.leaked not in ("0", "n/a (exited)")]
    if bad:
        print(f"lost or leaked in: {', '.join(bad)}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
