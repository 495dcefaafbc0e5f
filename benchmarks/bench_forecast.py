"""The ``forecast`` placement (the default) against a model of vllm-router ``cache_aware`` and the
cache-aware score rule it replaced (``incumbent``), in the simulator, on three traffic shapes
(issue 64: placement that never loses to a cache-aware router).

    .venv/bin/python -m benchmarks bench_forecast [--shapes shared,task,chat] [--seeds 0,1,2]
        [--loads 1.0,1.3] [--chat-minutes 3]

Shapes (loads as utilisation of round robin's measured capacity on the same mix):

* ``shared``: 100 system prompts of 6,144 tokens, 5 questions of 1,024 each, 200 tokens out
  (``bench_router_gap``'s; two Llama-3.1-8B/H100 engines);
* ``task``: the same prompts, output length following the task: each system prompt its own typical
  length (log-uniform in 16-1,024 tokens), each request a lognormal draw around it (sigma 0.5);
* ``chat``: the demo's multi-turn ShareGPT sessions on Azure 2023 arrivals (two Qwen3-32B/H100
  engines), windows of ``--chat-minutes``; its loads are ``--chat-loads``.

Set-ups, every one on the same draws: ``router``: each request routed on arrival by
``router_model.CacheAwareRouter`` at engine level (vLLM alone behind it); ``incumbent``: the gateway
(``sagesched``, the ``prefix`` predictor, its admission) with the cache-aware score rule
(``INCUMBENT_PROFILE``); ``forecast (default)``: the gateway as shipped, the ``forecast`` picker
(``policies.placement.forecast``; it assumes a Llama-3.1-8B/H100's speed); ``forecast, speed
known``: told the speed the engine model has for the shape's model (``harness.simtwin.engine_speed``;
the same for the shared shapes, which run that model); ``forecast, predictor X`` (``--predictors``):
the default with predictor X in place of ``prefix`` (``oracle`` is handed the answer key: the bound).
No other set-up sees an output length. Cells: ratios ÷ the router's TTLT mean and p99, TTFT p50,
prefix hit rate, and the preemptions of each.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from benchmarks.router_model import CacheAwareRouter
from sagegate.core.request import TraceRequest
from sagegate.core.summary import summarize

SHARED = ("llama-3.1-8b", "h100")
CHAT = ("qwen3-32b", "h100")


def shared_work(seed: int, task: bool) -> Callable[[float], list[TraceRequest]]:
    from sagegate.loadgen.synthetic import shared_prefix_workload, task_outputs

    def build(rate: float) -> list[TraceRequest]:
        work = shared_prefix_workload(
            rate=rate, groups=100, per_group=5, system_tokens=6144, question_tokens=1024,
            output_tokens=200, seed=seed,
        )  # fmt: skip
        return task_outputs(work, seed) if task else work

    return build


def draws(
    shape: str, seed: int, load: float, chat_minutes: float
) -> tuple[list[TraceRequest], float, str, str]:
    """One draw of ``shape`` at ``load``: its requests, the utilisation reached, model, GPU."""
    from sagegate.harness.simtwin import bulk_rate, capacity, scale_at, utilisation

    if shape == "chat":
        from sagegate.harness.live import demo_draw

        work, info = demo_draw(seed, chat_minutes, load, *CHAT)
        return work, float(info["utilisation"]), *CHAT  # type: ignore[arg-type]
    build = shared_work(seed, task=shape == "task")
    cap = capacity(build(1.0), model=SHARED[0], gpu=SHARED[1])
    work = build(scale_at(lambda x: bulk_rate(build(x)), load * cap["req_s"], highest=1000.0))
    return work, utilisation(work, cap), *SHARED


def run_cell(
    work: list[TraceRequest], model: str, gpu: str, predictors: Sequence[str] = ()
) -> dict[str, dict[str, float]]:
    """The router model and every set-up on ``work``; ``predictors``: the default again with each of
    these predictors in place of ``prefix`` (``oracle``: handed the answer key, the bound)."""
    from sagegate.core.request import answer_key
    from sagegate.harness.simtwin import engine_speed, simulate_run
    from sagegate.policies.placement.forecast import Forecast
    from sagegate.policies.placement.profile import INCUMBENT_PROFILE, PlacementProfile
    from sagegate.predictor.factory import make_predictor

    out: dict[str, dict[str, float]] = {}
    router = simulate_run(work, None, model=model, gpu=gpu, route=CacheAwareRouter())
    out["router"] = summarize(router.records)
    known = PlacementProfile(picker=Forecast(speed=engine_speed(model, gpu)))
    setups: list[tuple[str, PlacementProfile | None, str]] = [
        ("incumbent", INCUMBENT_PROFILE, "prefix"),
        ("forecast (default)", None, "prefix"),
        ("forecast, speed known", known, "prefix"),
    ]
    setups += [(f"forecast, predictor {p}", None, p) for p in predictors]
    for name, profile, predictor in setups:
        override = make_predictor("oracle", truth=answer_key(work)) if predictor == "oracle" else None
        res = simulate_run(
            work, "sagesched", model=model, gpu=gpu, placement="cache_aware", max_wait_s=1e9,
            profile=profile, predictor="none" if override is not None else predictor,
            predictor_override=override,
        )  # fmt: skip
        out[name] = summarize(res.records)
    return out


def cells(row: dict[str, float], base: dict[str, float]) -> str:
    r = {
        k: row[k] / base[k] if base[k] else float("nan") for k in ("ttlt_mean_s", "ttlt_p99_s", "ttft_p50_s")
    }
    hits = row.get("prefix_hit_rate", 0.0) / max(1e-9, base.get("prefix_hit_rate", 0.0))
    return (
        f"{r['ttlt_mean_s']:.3f} / {r['ttlt_p99_s']:.3f} | {r['ttft_p50_s']:.2f} | {hits:.3f} | "
        f"{row['preemptions']:.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="shared,task,chat")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--loads", default="1.0,1.3")
    ap.add_argument("--chat-loads", default="1.2")
    ap.add_argument("--chat-seeds", default="0,1")
    ap.add_argument("--chat-minutes", type=float, default=3.0)
    ap.add_argument(
        "--predictors", default="", help="The default again with these predictors (oracle, global, none)."
    )
    args = ap.parse_args()
    predictors = [p for p in args.predictors.split(",") if p]
    print("| shape | seed | load | set-up | TTLT mean / p99 ÷ router | TTFT p50 ÷ | hits ÷ | preemptions |")
    print("|---|---|---|---|---|---|---|---:|")
    for shape in args.shapes.split(","):
        seeds = args.chat_seeds if shape == "chat" else args.seeds
        loads = args.chat_loads if shape == "chat" else args.loads
        for seed in (int(s) for s in seeds.split(",")):
            for load in (float(x) for x in loads.split(",")):
                work, util, model, gpu = draws(shape, seed, load, args.chat_minutes)
                rows = run_cell(work, model, gpu, predictors)
                base = rows["router"]
                print(
                    f"| {shape} | {seed} | {util:.2f} | router | {base['ttlt_mean_s']:.2f} s / "
                    f"{base['ttlt_p99_s']:.2f} s | {base['ttft_p50_s']:.3f} s | "
                    f"{base.get('prefix_hit_rate', 0.0):.3f} | {base['preemptions']:.0f} |",
                    flush=True,
                )
                for name in (n for n in rows if n != "router"):
                    print(
                        f"| {shape} | {seed} | {util:.2f} | {name} | {cells(rows[name], base)} |", flush=True
                    )


if __name__ == "__main__":
    main()
