"""What a front costs in its own CPU: per request, and per streamed token it relays.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_cpu [--fronts router none semantic]
        [--requests 1000] [--streams 300] [--tokens 200] [--concurrency 32] [--rounds 2]
        [--profile out/cpu]

One simulated backend (time scale 100, so the engine is never what waits) behind each front in turn:
``router`` is vllm-router 0.1.17 ``round_robin`` (Rust; skipped with a note when not installed),
``none``/``semantic``/… are ``sagegate serve`` with that predictor and its defaults otherwise, and
``NAME:KEY=VALUE,…`` adds settings as ``SAGEGATE_KEY=VALUE`` (e.g. ``semantic:PAUSE__RESUME_BROKEN=false``).
Each round sends, through every front:

* ``--requests`` chat requests for one token each: the front's CPU per request;
* four phases of ``--streams`` streamed chat requests, fresh prompts each: one token each, then
  ``--tokens`` each twice, then one token each again. Its CPU per relayed token is the long phases'
  CPU less the short ones' over the difference in tokens. The order (short, long, long, short) puts
  the short and the long phases at the same mean history size: a predictor whose per-request cost
  grows with its history would otherwise show that growth as a per-token cost. Work a request sets
  off later on other threads (the semantic predictor's refits, its late embeddings) is counted in the
  phase that set it off: each phase runs from an idle front to an idle front (under 3% of a core).
  The last column counts the event loop's thread alone (where the relay runs; sagegate fronts only).

Prompts are ShareGPT first turns (the shipped slice), each sent once per front, so no cache of the
front's sees a repeat. CPU is the front process's user + system time over the phase (/proc). The
client is this process, ``--concurrency`` requests at a time. ``--profile DIR`` runs each sagegate
front under pyinstrument for the last round and writes its HTML profile there; ``--py-spy BIN`` with
it records every front of that round with py-spy instead (all threads, native frames left out) as
collapsed stacks (``NAME.folded``) and prints the frames running most (their own time). Figures are printed; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.servers import backend as served_backend
from sagegate.core.request import FORCED_OUTPUT_FIELD
from sagegate.harness.procs import free_port, running
from sagegate.loadgen.data import SHAREGPT, find_data

MODEL = "llama-3.1-8b"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Front:
    name: str
    predictor: str | None  # None: vllm-router
    env: dict[str, str]

    @classmethod
    def parse(cls, spec: str) -> Front:
        name, _, extra = spec.partition(":")
        env = {}
        for pair in filter(None, extra.split(",")):
            key, _, value = pair.partition("=")
            env[f"SAGEGATE_{key.upper()}"] = value
        return cls(spec, None if name == "router" else name, env)

    @property
    def slug(self) -> str:
        """Its name as a file name."""
        return self.name.replace(":", "_").replace(",", "_")


def cpu_s(pid: int, main_thread: bool = False) -> float:
    """User + system seconds of ``pid`` so far: all its threads, or its main thread alone (a
    sagegate front's event loop)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def prompts(n: int) -> list[str]:
    found = find_data(*SHAREGPT)
    if found is None:
        raise SystemExit("the ShareGPT slice is missing: sagegate data list")
    out: list[str] = []
    with gzip.open(found.path, "rt", encoding="utf-8") as fh:
        for line in fh:
            obj = json.loads(line)
            text = obj.get("prompt") or obj.get("text") or ""
            if isinstance(text, str) and 20 < len(text) < 8000:
                out.append(text)
            if len(out) >= n:
                break
    if len(out) < n:
        out = (out * (n // max(1, len(out)) + 1))[:n]
    return out


async def drive(url: str, texts: Sequence[str], tokens: int, concurrency: int) -> int:
    """Send every text as a streamed chat request for ``tokens`` tokens; returns the tokens received."""
    got = 0
    todo = iter(texts)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, trust_env=False) as client:

        async def worker() -> None:
            nonlocal got
            for text in todo:
                body = {
                    "model": "sim",
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": tokens,
                    "stream": True,
                    FORCED_OUTPUT_FIELD: tokens,
                }
                async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                    resp.raise_for_status()
                    async for line in resp.aiter_lines():
                        if line.startswith("data: {") and '"content":"' in line:
                            got += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return got


@contextlib.contextmanager
def py_spy(binary: str | None, pid: int, out: Path) -> Iterator[None]:
    """Sample ``pid`` with py-spy while the block runs (nothing without ``binary``)."""
    if binary is None:
        yield
        return
    cmd = [binary, "record", "--pid", str(pid), "--format", "raw", "--output", str(out), "--rate", "250"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def hottest(folded: Path, n: int = 15) -> list[tuple[float, str]]:
    """The frames most often running (their own share of samples, callees excluded) in py-spy's
    collapsed stacks: an inclusive share would rank the entry point and the event loop first."""
    total, seen = 0, dict[str, int]()
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        total += int(count)
        seen[leaf] = seen.get(leaf, 0) + int(count)
    return sorted(((c / max(1, total), f) for f, c in seen.items()), reverse=True)[:n]


@contextlib.contextmanager
def front(f: Front, backend: str, profile: Path | None) -> Iterator[tuple[str, int]]:
    """The front's URL and pid, stopped on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if f.predictor is None:
        from sagegate.harness.live import vllm_router_binary, vllm_router_command

        binary = vllm_router_binary()
        if binary is None:
            raise FileNotFoundError("vllm-router is not installed (pip install vllm-router)")
        cmd = vllm_router_command(binary, port, [backend], "round_robin")
        ready = "/health"
    else:
        serve = ["-m", "sagegate.cli", "serve", "--backend", backend, "--predictor", f.predictor]
        serve += ["--host", "127.0.0.1", "--port", str(port)]
        head = [sys.executable]
        if profile is not None:
            out = profile / f"{f.slug}.html"
            head += ["-m", "pyinstrument", "-r", "html", "-o", str(out)]
        cmd = [*head, *serve]
        ready = "/ready"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **f.env}
    with running(cmd, url, ready, startup_timeout_s=120, env=env) as (proc, _log):
        yield url, proc.pid
        if profile is not None and f.predictor is not None:
            proc.send_signal(signal.SIGINT)  # pyinstrument writes its profile as the process ends
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)


def settle(pid: int, idle_share: float = 0.03, every_s: float = 0.25, limit_s: float = 30.0) -> None:
    """Wait until ``pid`` is idle (under ``idle_share`` of a core over ``every_s``): work a phase's
    requests set off on other threads (embeddings that went late, refits) is then counted in the phase
    that caused it, not in the next one or nowhere."""
    deadline = time.monotonic() + limit_s
    last = cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = cpu_s(pid)
        if now - last < idle_share * every_s:
            return
        last = now
    print(f"  (front {pid} still busy after {limit_s:.0f} s)", file=sys.stderr)


def measure(
    url: str, pid: int, texts: Sequence[str], tokens: int, concurrency: int
) -> tuple[float, float, int]:
    """The CPU of one phase: all threads', the main thread's, and the tokens received; from an idle
    front to an idle front."""
    asyncio.run(drive(url, texts[:concurrency], tokens, concurrency))  # warm: connections, first model call
    settle(pid)
    before, loop_before = cpu_s(pid), cpu_s(pid, main_thread=True)
    got = asyncio.run(drive(url, texts[concurrency:], tokens, concurrency))
    settle(pid)
    return cpu_s(pid) - before, cpu_s(pid, main_thread=True) - loop_before, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fronts", nargs="+", default=["router", "none", "semantic"])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--py-spy", default=None, help="py-spy's executable (with --profile)")
    args = ap.parse_args()
    fronts = [Front.parse(s) for s in args.fronts]
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    need = 5 * args.concurrency + args.requests + 4 * args.streams  # per front and round
    texts = prompts(need * len(fronts) * args.rounds)
    print("front | round | CPU per request (ms) | CPU per relayed token (µs) | on the event loop (µs)")
    with served_backend(100, "--model", MODEL) as backend:
        cursor = 0
        for rnd in range(args.rounds):
            for f in fronts:
                profile = args.profile if rnd == args.rounds - 1 else None
                with contextlib.ExitStack() as stack:
                    wrap = None if args.py_spy else profile  # pyinstrument, unless py-spy samples instead
                    try:
                        url, pid = stack.enter_context(front(f, backend, wrap))
                    except FileNotFoundError as exc:
                        print(f"{f.name}: skipped ({exc})")
                        continue
                    one = texts[cursor : cursor + args.concurrency + args.requests]
                    cursor += len(one)
                    phases = []
                    for _ in range(4):
                        phases.append(texts[cursor : cursor + args.concurrency + args.streams])
                        cursor += len(phases[-1])
                    folded = (profile or Path()) / f"{f.slug}.folded"
                    with py_spy(args.py_spy if profile is not None else None, pid, folded):
                        per_request = measure(url, pid, one, 1, args.concurrency)[0] / args.requests
                        cpu, loop = [0.0, 0.0], [0.0, 0.0]  # short, long
                        got = [0, 0]
                        for k, texts_k in enumerate(phases):  # short, long, long, short
                            long = k in (1, 2)
                            tokens = args.tokens if long else 1
                            spent, on_loop, n = measure(url, pid, texts_k, tokens, args.concurrency)
                            cpu[long] += spent
                            loop[long] += on_loop
                            got[long] += n
                    extra = max(1, got[1] - got[0])
                    per_token = f"{(cpu[1] - cpu[0]) / extra * 1e6:.1f}"
                    loop_token = "-" if f.predictor is None else f"{(loop[1] - loop[0]) / extra * 1e6:.1f}"
                    row = [f.name, str(rnd), f"{per_request * 1e3:.2f}", per_token, loop_token]
                    print(" | ".join(row), flush=True)
                if profile is not None and args.py_spy and folded.exists():
                    for share, frame in hottest(folded):
                        print(f"    {share:6.1%}  {frame}")
    if args.profile is not None:
        print(f"profiles: {args.profile}/")


if __name__ == "__main__":
    main()
