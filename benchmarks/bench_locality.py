"""KV locality in the simulator (issue 36): what cache-aware placement and the rank buy, apart and together.

Two workloads with real prefix reuse, each at loads stated as utilisation of vLLM-behind-round-robin's
measured capacity on the mix (``harness.simtwin.capacity``; the offered rate read over the first 90% of
arrivals), through two simulated backends with
prefix caching on:

* ``shared-prefix``: llm-d's precise-prefix shape (``loadgen.synthetic.shared_prefix_workload``:
  150 groups x 5 prompts, a 6,000-token system prompt, a 1,200-token question, 1,000 tokens out;
  ``--groups`` etc. change it). 150 system prompts are about twice what one engine's cache holds.
* ``sessions``: multi-turn ShareGPT conversations (``loadgen.readers.sharegpt_sessions``), each turn
  its whole history, the real reply's length; the conversations a shipped predictor part learned
  from left out.

Set-ups, one run each on the same requests: vLLM behind round robin (engine level); the gateway with
``fcfs`` placing by room alone (admission only), ``fcfs`` cache-aware (placement alone), ``sagesched``
by room (the rank alone: the gateway before issue 36), ``sagesched`` cache-aware with its rank blind
to the cache (``shared_prefix=false``) and ``sagesched`` cache-aware (both, the default). The
figures are ratios to round robin, side by side. A cache-aware *router* (vllm-router's
``cache_aware``) is not simulated here: the live comparison (``benchmarks/neutral_client.py``) is.

    .venv/bin/python -m benchmarks bench_locality --workload shared-prefix --loads 0.5,1.0,1.3
    .venv/bin/python -m benchmarks bench_locality --workload sessions --sessions 400 --predictor semantic
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.core.summary import summarize

REPO = Path(__file__).resolve().parents[1]

SETUPS: list[tuple[str, str | None, str]] = [
    ("round robin", None, ""),
    ("fcfs, by room", "fcfs", "least_loaded"),
    ("fcfs, cache-aware", "fcfs", "cache_aware"),
    ("sagesched, by room", "sagesched", "least_loaded"),
    ("sagesched (rank blind to the cache), cache-aware", "sagesched:shared_prefix=false", "cache_aware"),
    ("sagesched, cache-aware", "sagesched", "cache_aware"),
]
"""SageSched's rank prices memory without the prompt tokens a request in flight already holds where
it knows them (cache-aware placement; ``shared_prefix``, on by default): the row before the last has
it off."""
METRICS = (
    "ttft_mean_s",
    "ttft_p90_s",
    "ttlt_mean_s",
    "ttlt_p99_s",
    "loaded_tok_s",
    "prefix_hit_rate",
    "preemptions",
)


SHARED = ("shared-prefix", "shared-task")
"""The shared-system-prompt workloads: ``shared-task`` is ``shared-prefix`` with output lengths that
follow the task (``loadgen.synthetic.task_outputs``: each system prompt its own typical length)."""


def builder(args: argparse.Namespace) -> Callable[[float], list[TraceRequest]]:
    """``build(rate)``: the workload at ``rate`` requests a second (sessions: sessions scaled alike)."""
    if args.workload in SHARED:
        from sagegate.loadgen.synthetic import shared_prefix_workload, task_outputs

        def shared(rate: float) -> list[TraceRequest]:
            work = shared_prefix_workload(
                rate=rate,
                groups=args.groups,
                per_group=args.per_group,
                system_tokens=args.system_tokens,
                question_tokens=args.question_tokens,
                output_tokens=args.output_tokens,
                seed=args.seed,
            )
            return task_outputs(work, args.seed) if args.workload == "shared-task" else work

        return shared
    from sagegate.loadgen.readers import read_trace
    from sagegate.predictor.learned import learned_prompts

    path = Path(args.data) / "sharegpt" / "sharegpt_v3_multiturn.jsonl.gz"
    exclude = learned_prompts()
    base = read_trace(
        path, "sharegpt-sessions", rate=1.0, sessions=args.sessions, seed=args.seed, exclude=exclude
    )
    per_session = len(base) / args.sessions

    def sessions(rate: float) -> list[TraceRequest]:
        return read_trace(
            path, "sharegpt-sessions", rate=rate / per_session, sessions=args.sessions, seed=args.seed,
            exclude=exclude, think_s=args.think_s,
        )  # fmt: skip

    return sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=(*SHARED, "sessions"), default="shared-prefix")
    ap.add_argument("--loads", default="0.5,1.0,1.3", help="utilisations of round robin's capacity")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--predictor", default="length-bucket", help="the gateway's predictor (semantic: slower)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups", type=int, default=150)
    ap.add_argument("--per-group", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=6000)
    ap.add_argument("--question-tokens", type=int, default=1200)
    ap.add_argument("--output-tokens", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--think-s", type=float, default=10.0)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = ap.parse_args()

    from sagegate.harness.simtwin import bulk_rate, capacity, scale_at, simulate_run

    build = builder(args)
    mix = build(1.0)
    cap = capacity(mix, model=args.model, gpu=args.gpu)
    print(f"{args.workload}: {len(mix)} requests; round robin's capacity {cap['req_s']:.2f} req/s "
          f"({cap['tok_s']:.0f} tok/s) on two {args.model}/{args.gpu}")  # fmt: skip
    results: dict[str, dict[str, dict[str, float]]] = {}
    for load in (float(x) for x in args.loads.split(",")):
        # bisection on the offered rate over the first 90% of arrivals: a session's turns keep their
        # think and read times, and a few long conversations stretch the last arrivals far out, so
        # neither the sessions' rate nor requests over the whole span measure the load
        scale = scale_at(lambda x: bulk_rate(build(x)), load * cap["req_s"], highest=1000.0)
        work = build(scale)
        row: dict[str, dict[str, float]] = {}
        for name, policy, placement in SETUPS:
            res = simulate_run(work, policy, model=args.model, gpu=args.gpu, predictor=args.predictor,
                               seed=args.seed, placement=placement or None, max_wait_s=1e9)  # fmt: skip
            s = summarize(res.records)
            s.setdefault("prefix_hit_rate", 0.0)
            row[name] = {k: float(s[k]) for k in METRICS} | {"completed": s["completed"]}
        results[f"{load:g}"] = row
        util = bulk_rate(work) / cap["req_s"]
        print(f"\nutilisation {util:.2f} ({len(work)} requests); ratios to round robin (its own figures)")
        rr = row["round robin"]
        print("| set-up | " + " | ".join(METRICS) + " | completed |")
        print("|---|" + "---:|" * (len(METRICS) + 1))
        for name, vals in row.items():
            cells = []
            for k in METRICS:
                if name == "round robin" or k in ("prefix_hit_rate", "preemptions"):
                    cells.append(f"{vals[k]:.3g}")
                else:
                    cells.append(f"{vals[k] / rr[k]:.2f}" if rr[k] else "-")
            print(f"| {name} | " + " | ".join(cells) + f" | {vals['completed']:.0f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"capacity": cap, "loads": results}, indent=1))


if __name__ == "__main__":
    main()
