"""Three fronts on real vLLM: round robin, vllm-router ``cache_aware`` and the gateway (``gateway``:
following the engines' KV events; ``gateway_approx``: its approximate index alone) before two real
vLLM engines (its CPU build, the tiny model: ``harness.vllm``), on a shared-prefix and a multi-turn
workload small enough for two cores.

    python -m benchmarks real_fronts [--requests 40] [--load 0.7] [--seeds 1,2,3] [--out results/real_fronts.json]

Needs ``make vllm``. Each front gets the same two engines with their prefix caches reset
(``POST /reset_prefix_cache``, vLLM's dev mode) and the same requests at the same times; every
front's hit rate is vLLM's own counters (``vllm:prefix_cache_hits/queries``) over its run. The load is
stated against capacity measured first: a burst of the shared-prefix requests through round robin,
completed per second of its makespan. The gateway runs its defaults (``sagesched``, ``prefix``) and
follows the engines' KV events with their own tokenizer (``tokenizer: backend``).

The model is random: it never ends early (``ignore_eos``), and each request asks for its length as a
client would (``max_tokens``); no true length reaches any front. On two cores the engines, fronts and
client share the CPU: a figure here says how the fronts order requests and place prefixes against
vLLM's own scheduler and caches, not what they would do at GPU speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

MODEL = "tiny"
WORDS = ("train", "platform", "ticket", "Basel", "Bern", "Zurich", "delay", "coach", "seat", "fare")


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


@dataclass
class Outcome:
    ttft_s: float
    ttlt_s: float
    ok: bool
    reply: str = ""


@dataclass
class Run:
    front: str
    workload: str
    outcomes: list[Outcome] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    busiest: float = 0.0
    """The busier engine's share of the generated tokens (0.5: even)."""
    predicted_hit_rate: float | None = None
    """A gateway's own prediction of the hit rate: the prompt tokens it predicted cached where it sent
    them ÷ those it sent (``sagegate_prefix_tokens``), beside vLLM's count."""

    def summary(self) -> dict[str, Any]:
        done = [o for o in self.outcomes if o.ok]
        ttft = sorted(o.ttft_s for o in done)
        ttlt = sorted(o.ttlt_s for o in done)

        def q(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

        c = self.counters
        return {
            "front": self.front, "workload": self.workload, "completed": len(done), "sent": len(self.outcomes),
            "ttft_mean": statistics.fmean(ttft) if ttft else float("nan"), "ttft_p50": q(ttft, 0.5),
            "ttft_p90": q(ttft, 0.9), "ttlt_mean": statistics.fmean(ttlt) if ttlt else float("nan"),
            "ttlt_p90": q(ttlt, 0.9),
            "hit_rate": c.get("prefix_hits", 0.0) / c["prefix_queries"] if c.get("prefix_queries") else 0.0,
            "preemptions": c.get("preemptions", 0.0), "busiest": self.busiest, "wall_s": self.wall_s,
            "predicted_hit_rate": self.predicted_hit_rate,
        }  # fmt: skip


# --- the client ---------------------------------------------------------------------------------------
async def ask(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int
) -> Outcome:
    """One streamed chat request: its time to first token and to last, and its text."""
    body = {
        "model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
    }  # fmt: skip
    t0 = time.perf_counter()
    first = None
    parts: list[str] = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Outcome(0.0, 0.0, False)
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                content = (choices[0].get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    parts.append(content)
    except httpx.HTTPError:
        return Outcome(0.0, 0.0, False)
    end = time.perf_counter()
    return Outcome((first or end) - t0, end - t0, True, "".join(parts))


def shared_prefix(n: int, groups: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` requests, each one of ``groups`` system prompts (~1k tokens) and a question of its own."""
    rng = random.Random(seed)
    systems = [f"Office {g}. " + text(random.Random(seed * 100 + g), 650) for g in range(groups)]
    return [
        [{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": text(rng, 30)}]
        for _ in range(n)
    ]


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


async def open_loop(
    url: str, requests: Sequence[list[dict[str, str]]], times: Sequence[float], max_tokens: int
) -> list[Outcome]:
    async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
        t0 = time.perf_counter()

        async def at(t: float, msgs: list[dict[str, str]]) -> Outcome:
            await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
            return await ask(client, url, msgs, max_tokens)

        return list(await asyncio.gather(*(at(t, m) for t, m in zip(times, requests, strict=True))))


async def conversations(
    url: str, starts: Sequence[float], turns: int, max_tokens: int, think_s: float, seed: int
) -> list[Outcome]:
    """A conversation starts at each of ``starts``; each turn re-sends its history with the real reply
    and a new question, ``think_s`` after the reply ends."""
    async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
        t0 = time.perf_counter()

        async def talk(i: int, start: float) -> list[Outcome]:
            rng = random.Random(seed * 1000 + i)
            history = [{"role": "system", "content": f"Desk {i}. " + text(rng, 120)}]
            out = []
            await asyncio.sleep(max(0.0, t0 + start - time.perf_counter()))
            for _ in range(turns):
                history.append({"role": "user", "content": text(rng, 120)})
                o = await ask(client, url, history, max_tokens)
                out.append(o)
                if not o.ok:
                    break
                history.append({"role": "assistant", "content": o.reply})
                await asyncio.sleep(think_s)
            return out

        done = await asyncio.gather(*(talk(i, s) for i, s in enumerate(starts)))
        return [o for conv in done for o in conv]


# --- the set-up --------------------------------------------------------------------------------------
@contextlib.contextmanager
def front(name: str, engines: Sequence[Any]) -> Iterator[str]:
    from sagegate.harness.live import gateway, vllm_router, vllm_router_binary

    urls = [e.url for e in engines]
    if name in ("round_robin", "cache_aware"):
        binary = vllm_router_binary()
        if binary is None:
            raise RuntimeError("vllm-router is not installed (the demo extra)")
        with vllm_router(binary, urls, name) as url:
            yield url
        return
    # gateway_approx: the approximate prefix index alone (no KV events, no /tokenize round trip)
    backends = [{"url": e.url, **({"kv_events": e.kv_events} if name == "gateway" else {})} for e in engines]
    env = {
        "SAGEGATE_BACKENDS": json.dumps(backends), "SAGEGATE_PLACEMENT__KV_EVENTS__TOKENIZER": "backend",
        "SAGEGATE_QUEUE__MAX_WAIT_S": "600", "SAGEGATE_ACCESS_LOG": "off",
    }  # fmt: skip
    with gateway([], "sagesched", "prefix", env=env) as url:
        yield url


def predicted_hit_rate(url: str) -> float:
    from sagegate.loadgen.scrape import counter_by_label

    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    tokens = counter_by_label(text, "sagegate_prefix_tokens", "what")
    return tokens.get("predicted_cached", 0.0) / tokens["sent"] if tokens.get("sent") else 0.0


def reset(engines: Sequence[Any]) -> None:
    for e in engines:
        e.reset_prefix_cache()


def measured(name: str, workload: str, engines: Sequence[Any], go: Any) -> Run:
    from sagegate.harness.live import backend_counters, counter_deltas

    urls = [e.url for e in engines]
    reset(engines)
    with front(name, engines) as url:
        before = backend_counters(urls)
        t0 = time.perf_counter()
        outcomes = asyncio.run(go(url))
        wall = time.perf_counter() - t0
        after = backend_counters(urls)
        run = Run(name, workload, outcomes, counter_deltas(before, after), wall)
        made = [a["generation_tokens"] - b["generation_tokens"] for a, b in zip(after, before, strict=True)]
        run.busiest = max(made) / sum(made) if sum(made) else 0.0
        if name.startswith("gateway"):
            run.predicted_hit_rate = predicted_hit_rate(url)
    s = run.summary()
    print(
        f"{workload:>13} {name:>12}: {s['completed']}/{s['sent']} done, TTFT mean {s['ttft_mean']:.3f} s "
        f"p50 {s['ttft_p50']:.3f} p90 {s['ttft_p90']:.3f}, TTLT mean {s['ttlt_mean']:.3f} s, "
        f"hit rate {s['hit_rate']:.3f}"
        + ("" if run.predicted_hit_rate is None else f" (predicted {run.predicted_hit_rate:.3f})")
        + f", busier engine {s['busiest']:.2f}, preemptions {s['preemptions']:.0f}",
        flush=True,
    )
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=40, help="shared-prefix requests (and a burst of them)")
    ap.add_argument("--groups", type=int, default=6, help="system prompts the shared-prefix requests share")
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--load", type=float, default=0.7, help="offered rate ÷ measured capacity")
    ap.add_argument("--blocks", type=int, default=64, help="each engine's KV cache in 128-token blocks")
    ap.add_argument(
        "--seeds", default="1,2,3", help="draws of requests and arrival times, each through every front"
    )
    ap.add_argument("--fronts", default="round_robin,cache_aware,gateway")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)

    from sagegate.harness.procs import exit_on_sigterm
    from sagegate.harness.vllm import vllm_engine

    exit_on_sigterm()
    fronts = a.fronts.split(",")
    seeds = [int(x) for x in a.seeds.split(",")]
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        engines = [
            stack.enter_context(
                vllm_engine(blocks=a.blocks, max_model_len=4096, kv_events=True, dev_mode=True, cpus=str(i))
            )
            for i in range(2)
        ]  # one core each: neither starves the other
        shared = shared_prefix(a.requests, a.groups, seeds[0])
        burst = measured(
            "round_robin",
            "burst",
            engines,
            partial(open_loop, requests=shared, times=[0.0] * len(shared), max_tokens=a.max_tokens),
        )
        capacity = a.requests / burst.wall_s
        rate = a.load * capacity
        print(
            f"capacity {capacity:.2f} req/s (a burst of {a.requests} through round robin); offered {rate:.2f} req/s",
            flush=True,
        )
        for seed in seeds:
            shared = shared_prefix(a.requests, a.groups, seed)
            times = arrivals(a.requests, rate, seed)
            starts = arrivals(a.conversations, rate / a.turns, seed + 1000)
            for name in fronts:
                run = measured(
                    name,
                    "shared_prefix",
                    engines,
                    partial(open_loop, requests=shared, times=times, max_tokens=a.max_tokens),
                )
                runs.append({**run.summary(), "seed": seed})
            for name in fronts:
                run = measured(
                    name, "multi_turn", engines,
                    partial(conversations, starts=starts, turns=a.turns, max_tokens=a.max_tokens, think_s=0.5, seed=seed),
                )  # fmt: skip
                runs.append({**run.summary(), "seed": seed})
    print(
        "\nfront ÷ cache_aware (same engines, requests and times), geometric mean over the seeds [each seed]:"
    )
    keys = ("ttft_mean", "ttft_p50", "ttlt_mean", "hit_rate")
    for workload in ("shared_prefix", "multi_turn"):
        for name in fronts:
            per: dict[str, list[float]] = {k: [] for k in keys}
            for r in runs:
                b = next(
                    x
                    for x in runs
                    if x["front"] == "cache_aware" and x["workload"] == workload and x["seed"] == r["seed"]
                )
                if r["front"] == name and r["workload"] == workload:
                    for k in keys:
                        per[k].append(r[k] / b[k] if b[k] else float("nan"))
            cells = ", ".join(
                f"{k} {statistics.geometric_mean(v):.2f} [{' '.join(f'{x:.2f}' for x in v)}]"
                for k, v in per.items()
                if v
            )
            print(f"  {workload:>13} {name:>14}: {cells}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"capacity_rps": capacity, "rate_rps": rate, "args": {k: str(v) for k, v in vars(a).items()}}
        a.out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
