"""Exactness check for simulator speed-ups: per-request results of a fixed set of runs, before/after.

``--save FILE`` records the results with the current code; ``--check FILE`` reruns the same runs and
fails (exit 1) on any difference beyond 1e-9 (times) or any difference at all (counts, status,
calibrated knees). The runs: study cells (the four default sources, first window, calibrated as the
study does, at KNEE and HIGH_PRESSURE, every entry of the panel) plus synthetic stress runs the study
never makes — shared prompt prefixes (prefix caching on), a small KV pool (heavy preemption), two
engines at both levels.

    .venv/bin/python -m benchmarks check_sim_exact --save /tmp/before.json
    .venv/bin/python -m benchmarks check_sim_exact --check /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from benchmarks.bench_study_cells import load_windows
from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimResult, SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.study.calibrate import calibrate_window
from sagegate.study.config import StudyConfig
from sagegate.study.simrun import run_window
from sagegate.study.sweep import panel

FIELDS = (
    "status",
    "dispatch_s",
    "first_token_s",
    "finish_s",
    "output_tokens",
    "preemptions",
    "cached_tokens",
    "backend",
)


def records(res: SimResult) -> list[list[Any]]:
    return [[getattr(r, f) for f in FIELDS] for r in res.records]


def synthetic(seed: int, n: int, shared: bool, text: bool) -> list[TraceRequest]:
    """Requests with shared prompt prefixes (hash ids or text), lognormal lengths, Poisson arrivals."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.04, n))
    out = []
    for i in range(n):
        p = int(rng.integers(40, 3000))
        o = int(min(4000, max(1, rng.lognormal(5.0, 1.0))))
        hid = None
        prompt = None
        if shared:
            fam = int(rng.integers(0, 4))
            nb = -(-p // 512)
            hid = tuple(
                [fam * 100 + j for j in range(min(nb, 3))] + [10_000 + i * 10 + j for j in range(nb - 3)]
            )
        if text:
            fam = int(rng.integers(0, 3))
            prompt = f"system prompt {fam} " * 200 + f"user {i} " * (p // 2)
        out.append(
            TraceRequest(
                float(t[i]),
                p,
                o,
                rid=i,
                hash_ids=hid,
                prompt=prompt,
                tenant=f"t{i % 3}",
                deadline_s=float(t[i]) + 5.0 + 0.02 * o,
            )
        )
    return out


def stress_runs() -> Iterator[tuple[str, SimResult]]:
    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    works = {
        "hash": synthetic(1, 300, shared=True, text=False),
        "text": synthetic(2, 250, shared=False, text=True),
        "plain": synthetic(3, 300, shared=False, text=False),
    }
    policies = [
        "fcfs",
        "sagesched",
        "fastserve",
        "trail",
        "srpt-oracle",
        "slai",
        "vllm-v0",
        "sarathi",
        "ssjf",
        "mean-cost",
        "edf",
        "vtc",
        "ltr",
    ]
    for wname, work in works.items():
        for blocks in (None, 400):
            for engines in (1, 2):
                for pol in policies:
                    for level in ("engine", "gateway"):
                        policy = parse_policy(pol)
                        if level not in policy.levels:
                            continue
                        cfg = EngineConfig(num_gpu_blocks_override=blocks)
                        # Two engines at the gateway: also cache-aware placement (its plugin profile).
                        two_at_gateway = level == "gateway" and engines > 1
                        for place in ("least_loaded", "cache_aware") if two_at_gateway else ("least_loaded",):
                            setup = SimSetup(
                                perf,
                                cfg,
                                engines=engines,
                                level=level,
                                policy=parse_policy(pol),
                                predictor=make_predictor(
                                    "noisy-oracle", relative_error=0.5, seed=4, truth=answer_key(work)
                                ),
                                placement=place,
                            )
                            name = f"stress/{wname}/b{blocks}/e{engines}/{pol}@{level}"
                            yield (
                                name + (f"/{place}" if place == "cache_aware" else ""),
                                simulate(work, setup),
                            )


def study_runs(windows: int) -> Iterator[tuple[str, Any]]:
    cfg = StudyConfig()
    corpus = load_windows(cfg, None, windows)
    entries = panel(cfg)
    for wins in corpus.values():
        for w in wins:
            cal = calibrate_window(w, cfg)
            yield f"calib/{w.id}", [cal.lambda_ref, cal.saturated_rate]
            for region in ("KNEE", "HIGH_PRESSURE"):
                factor = cfg.region_factor(region) * cal.lambda_ref
                for e in entries:
                    for err in (0.2, 1.0) if e.label == "sagesched@engine" else (0.2,):
                        res = run_window(
                            w.requests, factor, e, model=cfg.model, gpu=cfg.gpu, seed=w.seed, error=err
                        )
                        yield f"{w.id}/{region}/{e.label}/{err}", res


def collect(windows: int, stress: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs = [study_runs(windows)] + ([stress_runs()] if stress else [])
    for gen in runs:
        for name, res in gen:
            out[name] = res if isinstance(res, list) else records(res)
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def main() -> None:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save")
    g.add_argument("--check")
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--no-stress", action="store_true")
    args = ap.parse_args()
    t0 = time.process_time()
    got = collect(args.windows, not args.no_stress)
    print(f"{len(got)} runs in {time.process_time() - t0:.1f} s CPU")
    if args.save:
        with open(args.save, "w") as fh:
            json.dump(got, fh)
        return
    with open(args.check) as fh:
        want = json.load(fh)
    bad = [k for k in want if k not in got or not same(json.loads(json.dumps(got[k])), want[k])]
    missing = [k for k in got if k not in want]
    exact = sum(1 for k in want if k in got and json.loads(json.dumps(got[k])) == want[k])
    print(
        f"{len(want) - len(bad)}/{len(want)} runs identical within 1e-9 ({exact} bit-identical); "
        f"{len(missing)} not in the reference"
    )
    for k in bad[:20]:
        g_, w_ = got.get(k), want[k]
        detail = ""
        if isinstance(g_, list) and isinstance(w_, list) and len(g_) == len(w_):
            diffs = [
                (i, x, y)
                for i, (x, y) in enumerate(zip(json.loads(json.dumps(g_)), w_, strict=True))
                if not same(x, y)
            ]
            detail = f" first of {len(diffs)} diffs: {diffs[:1]}"
        print(f"  DIFF {k}{detail}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
