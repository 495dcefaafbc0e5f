"""Issue 18, in the simulator: what it costs when each gateway replica's predictor learns alone.

``bench_replicas.py``'s workload (238 requests, prompts ~1024 and outputs ~512 tokens, log-normal)
at 2x the saturated rate of two small-KV simulated backends (1024 blocks of 16), ``fcfs``, a history
baseline predicting (``global`` by default), three replicas behind a round-robin balancer sharing
the admission ledger (``order: threshold``, 50 ms sync, 0.5 ms commits), against one gateway.
Two ways of learning: one history for all replicas (what ``redis_url`` gives since the baselines
share theirs), or each replica its own (a predictor per replica, told only its own completions).

    python -m benchmarks bench_replica_history [--seeds 8] [--replicas 3] [--predictor global]

The seed changes the replicas' pass order only (the requests are the same). Figures are printed;
nothing is asserted.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.bench_replicas import workload
from benchmarks.load import capacity_rps
from sagegate.core.predictor import LengthPredictor, Prediction
from sagegate.core.request import PredictionQuery


class RoundRobinHistories:
    """N predictors, each told only the completions of the requests it predicted, the k-th arrival
    predicted by predictor ``k mod N``: the replica ``sim.replicas``' round-robin split sends it to
    (both count arrivals in order)."""

    def __init__(self, predictors: list[LengthPredictor]) -> None:
        self.predictors = predictors
        self.name = predictors[0].name
        self._arrivals = 0
        self._owner: dict[int, int] = {}

    async def predict(self, req: PredictionQuery) -> Prediction:
        r = self._owner.setdefault(req.rid, self._arrivals % len(self.predictors))
        self._arrivals += 1
        return await self.predictors[r].predict(req)

    async def observe(self, req: PredictionQuery, output_tokens: int, memo: object = None) -> None:
        await self.predictors[self._owner[req.rid]].observe(req, output_tokens, memo)

    async def start(self) -> None:
        for p in self.predictors:
            await p.start()

    async def close(self) -> None:
        for p in self.predictors:
            await p.close()


def main() -> None:
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.des import QueueLimits, SimSetup
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel
    from sagegate.sim.replicas import ReplicaSetup, simulate_replicas

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--predictor", default="global")
    args = ap.parse_args()
    engine = {"num_gpu_blocks_override": args.blocks}
    cap = capacity_rps(engine, 2, workload(args.requests, 1.0, args.blocks))
    work = workload(args.requests, args.overload * cap, args.blocks)
    cfg = EngineConfig(**engine)
    perf = PerfModel(get_model(cfg.model), get_gpu(cfg.gpu))
    n = args.replicas
    print(
        f"## {len(work)} requests at {args.overload:g}x the saturated {cap:.2f} req/s, predictor {args.predictor}"
    )
    print(f"{'seed':>4} {'setup':>28} {'preemptions':>11} {'req/s':>7} {'mean TTLT':>9}")
    cells: list[tuple[str, int, bool]] = [
        ("1 gateway", 1, False),
        (f"{n} replicas, one history", n, False),
        (f"{n} replicas, own histories", n, True),
    ]
    totals: dict[str, list[float]] = {label: [0.0, 0.0, 0.0] for label, _, _ in cells}
    for seed in range(args.seeds):
        for label, count, own in cells:
            pred: Any = (
                RoundRobinHistories([make_predictor(args.predictor) for _ in range(count)])
                if own
                else make_predictor(args.predictor)
            )
            setup = SimSetup(
                perf,
                cfg,
                engines=2,
                level="gateway",
                policy=parse_policy("fcfs"),
                predictor=pred,
                queue_limits=QueueLimits(),
            )
            rs = ReplicaSetup(
                replicas=count,
                order="threshold" if count > 1 else "none",
                rtt_s=0.0005 if count > 1 else 0.0,
                publish_s=0.05,
                seed=seed,
            )
            s = simulate_replicas(work, setup, rs)[0].summary
            t = totals[label]
            t[0] += s["preemptions"]
            t[1] += s["throughput_req_s"]
            t[2] += s["ttlt_mean_s"]
            print(
                f"{seed:>4} {label:>28} {s['preemptions']:>11.0f} {s['throughput_req_s']:>7.3f} "
                f"{s['ttlt_mean_s']:>9.2f}",
                flush=True,
            )
    one = totals[cells[0][0]]
    print(f"\nover {args.seeds} seeds, against 1 gateway (preemptions summed, req/s and TTLT mean):")
    for label, _, _ in cells[1:]:
        t = totals[label]
        print(
            f"{label:>28}: preemptions {t[0] / max(1.0, one[0]):.2f}x  req/s {t[1] / one[1]:.3f}x  "
            f"mean TTLT {t[2] / one[2]:.3f}x"
        )


if __name__ == "__main__":
    main()
