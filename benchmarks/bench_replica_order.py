"""Issue 18 part 2, in the simulator: one order across gateway replicas (``sim.replicas``).

ShareGPT pairs (their own output lengths) timed by the Azure 2023 conversation arrivals, two
memory-bound simulated H100s (Qwen3-32B), the gateway's default policy ``sagesched`` with the
``length-bucket`` predictor learning online (no oracle), the live queue bounds (``QueueLimits``:
60 s wait). Loads are utilisation of vLLM alone's measured capacity on the same engines (a burst).
Per load: one replica, then for each replica count the three orders (``none``: today's live
behaviour; ``threshold``; ``global``), the same requests split round robin. Ratios are against the
one replica of the same run.

    python -m benchmarks bench_replica_order [--requests 1500] [--replicas 2 3] [--loads 0.9 2.0]
        [--rtt-ms 0.5] [--publish-ms 50] [--policy sagesched] [--wake own|any] [--split round-robin|random]
        [--send-first 0.1 0.2]

``--send-first F ...`` adds ``threshold`` rows whose dispatches go at once within a send-first budget
(``ReplicaSetup.send_first_share``; the exact ledger grants no room twice, so these rows show what
the commit wait costs, not the live over-admission).

``--publish-ms`` is the ledger sync (a replica learns of the others' releases there, and under
``threshold`` publishes its head there): each value gives a ``none`` and a ``threshold`` row.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sagegate.core.request import TraceRequest
from sagegate.loadgen.data import data_root
from sagegate.loadgen.records import rebase, scale_rate

if TYPE_CHECKING:
    from sagegate.sim.des import SimSetup

MODEL, GPU = "qwen3-32b", "h100"


def workload(n: int) -> list[TraceRequest]:
    from sagegate.loadgen.readers import read_trace

    root = data_root()
    conv = rebase(read_trace(root / "azure2023" / "AzureLLMInferenceTrace_conv.csv")[2000 : 2000 + n])
    pairs = read_trace(
        root / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz",
        arrivals_from=[r.arrival_s for r in conv],
        limit=n,
    )
    return rebase(pairs[:n])


def sim_setup(
    policy: str,
    level: str = "gateway",
    predictor: str = "length-bucket",
    work: list[TraceRequest] | None = None,
) -> SimSetup:
    from sagegate.core.request import answer_key
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.des import QueueLimits, SimSetup
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    perf = PerfModel(get_model(MODEL), get_gpu(GPU))
    pred = None
    if level == "gateway" and predictor.startswith("noisy-oracle:"):  # a sensitivity check only
        error = float(predictor.split(":", 1)[1])
        pred = make_predictor("noisy-oracle", relative_error=error, truth=answer_key(work or []))
    elif level == "gateway":
        pred = make_predictor(predictor)
    return SimSetup(
        perf,
        EngineConfig(model=MODEL, gpu=GPU),
        engines=2,
        level=level,
        policy=parse_policy(policy if level == "gateway" else "fcfs"),
        predictor=pred,
        queue_limits=QueueLimits() if level == "gateway" else None,
    )


def capacity(work: list[TraceRequest]) -> float:
    """Requests/s vLLM alone (engine level, round robin) sustains on ``work``: all in one burst."""
    from sagegate.sim.des import simulate

    s = simulate([replace(r, arrival_s=0.0) for r in work], sim_setup("fcfs", "engine")).summary
    return s["completed"] / s["makespan_s"]


def main() -> None:
    from sagegate.sim.replicas import ReplicaSetup, simulate_replicas

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--loads", type=float, nargs="+", default=[0.9, 2.0])
    ap.add_argument("--rtt-ms", type=float, default=0.5)
    ap.add_argument(
        "--send-first",
        type=float,
        nargs="*",
        default=[],
        help="also threshold replicas with each of these send_first_share values",
    )
    ap.add_argument("--publish-ms", type=float, nargs="+", default=[50.0], help="ledger sync / publish")
    ap.add_argument("--policy", default="sagesched")
    ap.add_argument(
        "--split",
        default="round-robin",
        choices=["round-robin", "random", "prompt"],
        help="prompt: replica k takes the k-th slice of prompt lengths (a balancer's affinity)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the replicas' pass order (and a random split)")
    ap.add_argument(
        "--predictor",
        default="length-bucket",
        help="a live predictor, or noisy-oracle:ERROR (sensitivity only)",
    )
    ap.add_argument("--wake", default="own", choices=["own", "any"], help="when a replica runs a pass")
    args = ap.parse_args()
    t0 = time.perf_counter()
    work = workload(args.requests)
    cap = capacity(work)
    rate = len(work) / work[-1].arrival_s
    rtt = args.rtt_ms / 1000
    print(f"## {len(work)} requests, 2x {MODEL} on {GPU}, vLLM alone saturates at {cap:.2f} req/s")
    print(
        f"   policy {args.policy}, predictor {args.predictor}, seed {args.seed}, rtt {args.rtt_ms:g} ms, split {args.split}, wake {args.wake}\n"
    )
    head = (
        f"{'load':>5} {'setup':>28} {'mean TTLT':>9} {'p99 TTLT':>9} {'req/s':>7} {'preempt':>8} "
        f"{'rejected':>8} {'inversions':>10} {'holds':>7} {'delay ms':>8}   ratios vs 1 replica (mean, p99, req/s)"
    )
    print(head)
    for load in args.loads:
        timed = scale_rate(work, load * cap / rate)
        cells: list[tuple[str, ReplicaSetup]] = [("1 replica", ReplicaSetup(replicas=1, rtt_s=0.0))]
        for n in args.replicas:
            prompts = sorted(r.prompt_tokens for r in work)
            edges = (
                tuple(prompts[len(prompts) * k // n] for k in range(1, n)) if args.split == "prompt" else ()
            )
            kw: dict[str, Any] = {"prompt_edges": edges, "seed": args.seed}
            for pub in args.publish_ms:
                for order in ("none", "threshold"):
                    rs = ReplicaSetup(n, order, args.split, rtt, pub / 1000, args.wake, **kw)  # type: ignore[arg-type]
                    cells.append((f"{n} replicas, {order} {pub:g}ms", rs))
                for share in args.send_first:
                    rs = ReplicaSetup(
                        n, "threshold", args.split, rtt, pub / 1000, args.wake, send_first_share=share, **kw
                    )  # type: ignore[arg-type]
                    cells.append((f"{n}, threshold, first {share:g}", rs))
            cells.append((f"{n} replicas, global", ReplicaSetup(n, "global", args.split, rtt, **kw)))
        base: dict[str, float] = {}
        for label, rs in cells:
            res, st = simulate_replicas(
                timed, sim_setup(args.policy, predictor=args.predictor, work=timed), rs
            )
            s = res.summary
            if not base:
                base = s
            delay = 1000 * st.delay_s / max(st.dispatches, 1)
            print(
                f"{load:>5g} {label:>28} {s['ttlt_mean_s']:>9.2f} {s['ttlt_p99_s']:>9.2f} "
                f"{s['throughput_req_s']:>7.3f} {s['preemptions']:>8.0f} {s['rejected']:>8.0f} "
                f"{st.inversions:>10} {st.holds:>7} {delay:>8.3f}   "
                f"{s['ttlt_mean_s'] / base['ttlt_mean_s']:.3f} {s['ttlt_p99_s'] / base['ttlt_p99_s']:.3f} "
                f"{s['throughput_req_s'] / base['throughput_req_s']:.3f}",
                flush=True,
            )
        print()
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
