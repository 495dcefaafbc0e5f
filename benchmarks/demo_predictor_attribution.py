"""What the semantic predictor's new parts (ranking head, shipped prior, spread correction) move in the
demo's simulated twin: gateway ``sagesched`` ÷ vLLM alone with the default predictor and with the
previous one (``SemanticConfig(head_weight=0, head_prior_weight=0, shipped_prior=False,
calibrate=False)``), on the demo's workload (30 s of Azure conversation arrivals carrying ShareGPT
pairs, utilisation 1.2, two Qwen3-32B/H100 engines, the demo's 30 s queue timeout in engine time).

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks demo_predictor_attribution [--utilisation 1.2]
"""

from __future__ import annotations

import argparse
import functools
import os

METRICS = ("ttlt_mean_s", "ttlt_p50_s", "ttlt_p99_s", "ttft_mean_s", "throughput_tok_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utilisation", type=float, default=1.2)
    ap.add_argument("--minutes", type=float, default=0.5)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sagegate.harness.simtwin as twin
    from sagegate.core.summary import summarize
    from sagegate.harness.live import azure_workload
    from sagegate.predictor.semantic import KNN_ONLY

    model, gpu = "qwen3-32b", "h100"
    mix = azure_workload(max(args.minutes, 2.0), 4.0, 0, quiet=True).requests
    scale, cap = twin.scale_for(
        lambda s: azure_workload(args.minutes, s, 0, quiet=True).requests,
        args.utilisation,
        mix,
        model=model,
        gpu=gpu,
    )
    work = azure_workload(args.minutes, scale, 0, quiet=True).requests
    print(f"{len(work)} requests at utilisation {twin.utilisation(work, cap):.2f}")
    alone = summarize(twin.simulate_run(work, None, model=model, gpu=gpu).records)
    previous = KNN_ONLY
    default = twin.sim_predictor
    for label, config in (("default predictor", None), ("previous predictor", previous)):
        twin.sim_predictor = functools.partial(default, semantic=config)
        gw = summarize(
            twin.simulate_run(
                work, "sagesched", model=model, gpu=gpu, predictor="semantic", max_wait_s=30.0
            ).records
        )
        print(f"  {label}: " + ", ".join(f"{m} {gw[m] / alone[m]:.3f}" for m in METRICS))
    twin.sim_predictor = default


if __name__ == "__main__":
    main()
