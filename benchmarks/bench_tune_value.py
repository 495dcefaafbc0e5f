"""What the encoder's length tune changes in what the scheduler buys, in the simulator (issue 19).

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks bench_tune_value [--seeds 0 1 2 3 4] [--minutes 0.5]
        [--utilisation 1.2] [--policy sagesched]

The demo's workload (``harness.live.azure_workload``: Azure conversation arrivals, each a real ShareGPT
pair the shipped parts never learned from, at ``--utilisation`` of vLLM alone's capacity), through the
demo's simulated twin (``harness.simtwin.simulate_run``, two Qwen3-32B/H100 engines): vLLM alone, and
the gateway's ``--policy`` with the semantic predictor over the stock encoder and over the tuned one
(``predictor_options.embed_tuned``). One seed is one prompt shuffle; the simulator is deterministic,
so each row is exact for its seed. Prints, per seed and as a mean, each gateway's mean / p99 TTLT as a
ratio of vLLM alone's and the Kendall tau-b of its predictions (the demo's own figure,
``loadgen.plots.prediction_accuracy``: predicted mean against generated length, completed requests).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from sagegate.core.summary import summarize
from sagegate.gateway.settings_predictor import SemanticSettings
from sagegate.harness.live import azure_workload
from sagegate.harness.simtwin import scale_for, simulate_run
from sagegate.loadgen.plots import prediction_accuracy

MODEL, GPU = "qwen3-32b", "h100"
ENCODERS = {"stock": False, "tuned": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument("--minutes", type=float, default=0.5)
    ap.add_argument("--utilisation", type=float, default=1.2)
    ap.add_argument("--policy", default="sagesched")
    args = ap.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = {e: [] for e in ENCODERS}
    print(f"{'seed':>4} {'n':>4}  " + "  ".join(f"{e}: mean / p99 TTLT ratio, tau-b" for e in ENCODERS))
    for seed in args.seeds:
        mix = azure_workload(max(args.minutes, 2.0), 4.0, seed, quiet=True).requests
        scale, _ = scale_for(
            lambda s, seed=seed: azure_workload(args.minutes, s, seed, quiet=True).requests,
            args.utilisation,
            mix,
            model=MODEL,
            gpu=GPU,
        )
        work = azure_workload(args.minutes, scale, seed, quiet=True).requests
        alone = summarize(simulate_run(work, None, model=MODEL, gpu=GPU).records)
        cells = []
        for name, tuned in ENCODERS.items():
            opts = SemanticSettings(embed_tuned=tuned)
            res = simulate_run(
                work,
                args.policy,
                model=MODEL,
                gpu=GPU,
                predictor="semantic",
                seed=seed,
                predictor_options=opts,
            )
            s = summarize(res.records)
            row = (
                s["ttlt_mean_s"] / alone["ttlt_mean_s"],
                s["ttlt_p99_s"] / alone["ttlt_p99_s"],
                (prediction_accuracy(res.records) or {}).get("kendall_tau", float("nan")),
            )
            rows[name].append(row)
            cells.append(f"{row[0]:.3f} / {row[1]:.3f}, {row[2]:.3f}")
        print(f"{seed:>4} {len(work):>4}  " + "  ".join(f"{c:<33}" for c in cells), flush=True)
    for name, r in rows.items():
        a = np.array(r)
        print(
            f"mean over {len(r)} seeds, {name}: mean TTLT {a[:, 0].mean():.3f}, p99 {a[:, 1].mean():.3f}, "
            f"tau-b {statistics.fmean(a[:, 2]):.3f}"
        )
    diff = np.array(rows["tuned"])[:, 0] - np.array(rows["stock"])[:, 0]
    print(
        f"tuned - stock, mean TTLT ratio: {diff.mean():+.4f} (per seed: {', '.join(f'{d:+.3f}' for d in diff)})"
    )


if __name__ == "__main__":
    main()
