"""Where the gateway's prefix hits go behind vllm-router ``cache_aware``'s at full load (issue 52), in
the simulator: the same shared-prefix draws through a model of the router (``router_model``) and
through the gateway, and which requests miss the cache and why.

The workload is the live comparison's (``bench_routers --workloads shared-prefix --groups 100
--per-group 5 --question-tokens 1024 --output-tokens 200``): 100 groups of a 6,144-token system prompt,
5 prompts each, 200 tokens out, at loads stated as utilisation of round robin's capacity. Set-ups:

* ``router model``: engine level, each request routed on arrival by ``router_model.CacheAwareRouter``;
* ``gateway``: ``sagesched``, cache-aware placement, the live gateway's admission (the product);
* ``bounds lifted``: the same with admission's bounds lifted (peak target 100, no waiting bound);
* ``always sticky``: the placement scores the cached prefix alone (``prefix_hit: 1``, no
  ``queued_prefill``): a warm backend is never left for a cold one that the filters keep;
* ``both``: bounds lifted and always sticky;
* ``forecast``: the ``forecast`` picker (``policies.placement.forecast``: the backend where the last
  token is forecast soonest, counting what it costs the requests already there), with the live
  admission, with its bounds lifted, and with only its waiting bounds lifted (the memory rule kept).

Each request is classed by the backend its group's earlier requests went to: ``hit`` (its system
prompt came from the cache), ``first`` (its group's first), ``elsewhere`` (sent to a backend none of
its group had gone to), ``evicted`` (its group had been there and finished prefilling), ``racing``
(its group's earlier request there had not yet finished its prefill). Ratios ÷ the router model.

    .venv/bin/python -m benchmarks bench_router_gap [--seeds 0,1,2] [--loads 0.5,1.0,1.3] [--setups a,b]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.bench_locality import builder
from benchmarks.router_model import CacheAwareRouter
from sagegate.core.record import RequestRecord
from sagegate.core.request import TraceRequest
from sagegate.core.summary import summarize

MODEL, GPU = "llama-3.1-8b", "h100"
WAITING_LIFTED = {"max_waiting_tokens": 100_000_000, "max_waiting": 100_000}
LIFTED = {**WAITING_LIFTED, "peak_target": 100}
STICKY = {"prefix_hit": 1.0}
FORECAST = "forecast"
SETUPS: dict[str, tuple[Mapping[str, Any], Mapping[str, float] | str | None]] = {
    "gateway": ({}, None),
    "bounds lifted": (LIFTED, None),
    "always sticky": ({}, STICKY),
    "both": (LIFTED, STICKY),
    "forecast": ({}, FORECAST),
    "forecast lifted": (LIFTED, FORECAST),
    "forecast memory rule": (WAITING_LIFTED, FORECAST),
}
CLASSES = ("hit", "first", "elsewhere", "evicted", "racing")


def classify(
    records: Sequence[RequestRecord], work: Sequence[TraceRequest], system_tokens: int
) -> collections.Counter[str]:
    """Each request's class (module docstring), in dispatch order."""
    group = {r.rid: (r.extra or {})["group"] for r in work}
    seen: dict[int, list[RequestRecord]] = collections.defaultdict(list)
    out: collections.Counter[str] = collections.Counter()
    for r in sorted(records, key=lambda r: (r.dispatch_s or 0.0, r.rid)):
        earlier = seen[group[r.rid]]
        there = [e for e in earlier if e.backend == r.backend]
        if r.cached_tokens >= system_tokens - 16:  # its system prompt, less a partial block
            kind = "hit"
        elif not earlier:
            kind = "first"
        elif not there:
            kind = "elsewhere"
        elif any(e.first_token_s is not None and e.first_token_s <= (r.dispatch_s or 0.0) for e in there):
            kind = "evicted"
        else:
            kind = "racing"
        out[kind] += 1
        earlier.append(r)
    return out


def figures(s: Mapping[str, float], base: Mapping[str, float] | None) -> str:
    """A row's hit rate, TTFT and TTLT cells: its own figures (``base`` None), else ratios to ``base``."""
    if base is None:
        return (
            f"{s['prefix_hit_rate']:.3f} | {s['ttft_mean_s']:.3f} / {s['ttft_p50_s']:.3f} "
            f"| {s['ttlt_mean_s']:.2f} / {s['ttlt_p99_s']:.2f}"
        )
    r = {
        k: s[k] / base[k]
        for k in ("prefix_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttlt_mean_s", "ttlt_p99_s")
    }
    return (
        f"{r['prefix_hit_rate']:.3f} | {r['ttft_mean_s']:.2f} / {r['ttft_p50_s']:.2f} "
        f"| {r['ttlt_mean_s']:.3f} / {r['ttlt_p99_s']:.3f}"
    )


def _profile(spec: Mapping[str, float] | str | None, build: Any) -> Any:
    """A set-up's placement profile: the default (None), scorers with the incumbent picker, or a
    picker by name (its profile's scorers unused)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return build({"prefix_hit": 1.0}, picker=spec)
    return build(spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--loads", default="0.5,1.0,1.3")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--per-group", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=6144)
    ap.add_argument("--question-tokens", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=200)
    ap.add_argument("--setups", default=",".join(SETUPS), help="which set-ups beside the router model")
    args = ap.parse_args()
    chosen = [s for s in args.setups.split(",") if s]

    from sagegate.harness.simtwin import bulk_rate, capacity, scale_at, simulate_run
    from sagegate.policies.placement import build_profile

    print(
        "| seed | load | set-up | hit rate | TTFT mean / p50 | TTLT mean / p99 | "
        + " / ".join(CLASSES)
        + " |"
    )
    print("|---|---|---|---:|---|---|---|")
    for seed in (int(s) for s in args.seeds.split(",")):
        build = builder(argparse.Namespace(workload="shared-prefix", seed=seed, **{
            k: getattr(args, k) for k in ("groups", "per_group", "system_tokens", "question_tokens", "output_tokens")
        }))  # fmt: skip
        cap = capacity(build(1.0), model=MODEL, gpu=GPU)
        for load in (float(x) for x in args.loads.split(",")):
            work = build(
                scale_at(lambda x, build=build: bulk_rate(build(x)), load * cap["req_s"], highest=1000.0)
            )
            router = simulate_run(work, None, model=MODEL, gpu=GPU, route=CacheAwareRouter())
            base = summarize(router.records)
            rows = [("router model", router, base)]
            for name in chosen:
                admission, scorers = SETUPS[name]
                res = simulate_run(
                    work, "sagesched", model=MODEL, gpu=GPU, predictor="length-bucket",
                    placement="cache_aware", max_wait_s=1e9, admission=admission,
                    profile=_profile(scorers, build_profile),
                )  # fmt: skip
                rows.append((name, res, summarize(res.records)))
            for name, res, s in rows:
                kinds = classify(res.records, work, args.system_tokens)
                print(
                    f"| {seed} | {load:g} | {name} | {figures(s, None if res is router else base)} | "
                    + " / ".join(str(kinds[c]) for c in CLASSES)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
