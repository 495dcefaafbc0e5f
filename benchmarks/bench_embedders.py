"""The embedder's runtimes side by side: torch against ONNX Runtime (and the static table), one run.

Prints two Markdown tables:

1. Gateway processes (``sagegate serve`` with a simulated backend), started in turn round by round:
   ``predictor: global``, then ``semantic`` on each runtime. Start-up is spawn to the first answer
   (the lifespan loads the model and embeds once before it serves); RSS is the gateway's after
   ``--requests`` chat requests have gone through it.
2. In one process, each embedder (with the shipped length tune, and the default ONNX int8 one also
   with the stock weights) called in turn on the same prompt (so a noisy, shared machine
   weighs on each alike): latency p50/p99 of one embedding for short prompts (under 20 word pieces)
   and long ones (~13k tokens, of which the window is read), and batch throughput (``--batch``
   prompts in one call).

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks bench_embedders [--rounds 3] [--calls 150] [--mpnet]

``--mpnet`` adds the opt-in all-mpnet-base-v2 (ONNX int8, tuned, projected; fetched first with
``sagegate predictor fetch-encoder mpnet``) to both tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from benchmarks.servers import backend, stop_server
from sagegate.harness.procs import free_port
from sagegate.loadgen.data import SHAREGPT, find_data
from sagegate.predictor.embedder import MiniLMEmbedder, TextEmbedder
from sagegate.predictor.evaluate import load_items
from sagegate.predictor.factory import EmbedderOptions, make_embedder

REPO = Path(__file__).resolve().parents[1]

GATEWAYS = {
    "global": {"predictor": "global"},
    "semantic, torch int8": {"predictor": "semantic", "predictor_options": {"embed_runtime": "torch"}},
    "semantic, onnx int8": {"predictor": "semantic", "predictor_options": {"embed_runtime": "onnx"}},
}
MPNET_GATEWAY = {"predictor": "semantic", "predictor_options": {"embed_model": "mpnet"}}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one_gateway(name: str, backend_url: str, prompts: list[str], requests: int) -> tuple[float, float]:
    """Start-up seconds and RSS (MB) after ``requests`` chat requests."""
    port = free_port()
    cfg = {"backends": [backend_url], "port": port, "log_level": "warning", "policy": "sagesched"}
    cfg.update(GATEWAYS[name])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway {name} exited with {proc.returncode}")
            try:
                httpx.get(url + "/ready", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
            if time.perf_counter() - t0 > 300:
                raise RuntimeError(f"gateway {name} did not start in 300 s")
        startup = time.perf_counter() - t0
        with httpx.Client(timeout=60) as client:
            for i in range(requests):
                body = {
                    "model": "sim",
                    "max_tokens": 16,
                    "messages": [{"role": "user", "content": prompts[i]}],
                }
                client.post(url + "/v1/chat/completions", json=body).raise_for_status()
        return startup, rss_mb(proc.pid)
    finally:
        stop_server(proc)
        os.unlink(f.name)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def gateways(rounds: int, requests: int, prompts: list[str]) -> None:
    starts: dict[str, list[float]] = {n: [] for n in GATEWAYS}
    rss: dict[str, list[float]] = {n: [] for n in GATEWAYS}
    with backend(20.0) as be:
        for r in range(rounds):
            order = list(GATEWAYS) if r % 2 == 0 else list(reversed(GATEWAYS))
            for name in order:
                s, m = one_gateway(name, be, prompts, requests)
                starts[name].append(s)
                rss[name].append(m)
                print(f"round {r}: {name}: start-up {s:.2f} s, RSS {m:.0f} MB", file=sys.stderr)
    print(
        f"\n| gateway ({rounds} starts each, interleaved) | start-up s, median (min-max) | RSS MB, median |"
    )
    print("|---|---|---|")
    for name in GATEWAYS:
        s = starts[name]
        print(
            f"| {name} | {statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f}) | {statistics.median(rss[name]):.0f} |"
        )


def embedders(static_table: Path | None, mpnet: bool) -> dict[str, TextEmbedder]:
    out: dict[str, TextEmbedder] = {
        "torch int8": MiniLMEmbedder(quantize=True),
        "onnx int8": make_embedder(EmbedderOptions(runtime="onnx", quantize=True)),
        "onnx int8, stock weights": make_embedder(
            EmbedderOptions(runtime="onnx", quantize=True, tuned=False)
        ),
        "torch fp32": MiniLMEmbedder(quantize=False),
        "onnx fp32": make_embedder(EmbedderOptions(runtime="onnx", quantize=False)),
    }
    if mpnet:
        out["onnx int8, mpnet"] = make_embedder(EmbedderOptions(model="mpnet"))
    if static_table is not None:
        from sagegate.predictor.embedder_static import StaticEmbedder

        out["static (distilled)"] = StaticEmbedder(static_table)
    return out


def latency(
    calls: int, batch: int, short: list[str], long: list[str], static_table: Path | None, mpnet: bool
) -> None:
    embs = embedders(static_table, mpnet)
    loads: dict[str, float] = {}
    for name, e in embs.items():
        t = time.perf_counter()
        e.embed(["warm up"])
        loads[name] = time.perf_counter() - t
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in embs for k in ("short", "long")}
    rng = random.Random(0)
    for i in range(calls):
        for kind, pool in (("short", short), ("long", long)):
            text = pool[i % len(pool)]
            names = list(embs)
            rng.shuffle(names)
            for name in names:
                t = time.perf_counter()
                embs[name].embed([text])
                times[(name, kind)].append(1000 * (time.perf_counter() - t))
    through: dict[str, float] = {}
    texts = (short * (batch // len(short) + 1))[:batch]
    for name in embs:
        t = time.perf_counter()
        embs[name].embed(texts)
        through[name] = batch / (time.perf_counter() - t)
    print(
        f"\n| embedder | first call s (load) | short p50 / p99 ms | long p50 / p99 ms | batch of {batch}, prompts/s |"
    )
    print("|---|---|---|---|---|")
    for name in embs:
        s, lg = times[(name, "short")], times[(name, "long")]
        print(
            f"| {name} | {loads[name]:.2f} | {pct(s, 50):.1f} / {pct(s, 99):.1f} | "
            f"{pct(lg, 50):.1f} / {pct(lg, 99):.1f} | {through[name]:.0f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument(
        "--static-table",
        type=Path,
        default=None,
        help="the distilled table (predictor eval --runtime static makes it)",
    )
    ap.add_argument("--skip-gateways", action="store_true")
    ap.add_argument("--mpnet", action="store_true", help="add the opt-in mpnet encoder (fetched first)")
    args = ap.parse_args()
    if args.mpnet:
        GATEWAYS["semantic, onnx int8, mpnet"] = MPNET_GATEWAY
        make_embedder(EmbedderOptions(model="mpnet"))  # exported now if missing
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    found = find_data(*SHAREGPT)
    if found is None:
        raise SystemExit("no ShareGPT pairs found")
    prompts = [it.prompt for it in load_items(found.path, 3000) if isinstance(it.prompt, str)]
    ruler = MiniLMEmbedder().load().tokenizer
    short = [p for p in prompts if len(ruler(p)["input_ids"]) < 20][:200]
    rng = random.Random(1)
    joined = " ".join(prompts)
    long = []
    for _ in range(50):
        at = rng.randrange(0, len(joined) - 60_000)
        long.append(joined[at : at + 52_000])  # ~13k tokens
    for quantize in (True, False):  # exported now if missing, so no start-up below pays for it
        make_embedder(EmbedderOptions(runtime="onnx", quantize=quantize))
    print(json.dumps({"cpus": os.cpu_count(), "loadavg": os.getloadavg()}))
    if not args.skip_gateways:
        gateways(args.rounds, args.requests, short)
    latency(args.calls, args.batch, short, long, args.static_table, args.mpnet)
    print(json.dumps({"loadavg_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
