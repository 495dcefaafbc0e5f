"""Simulator speed on real study cells: CPU per cell, per source (the sweep's cost model).

Builds the study's corpus (default configuration), calibrates the first ``--windows`` windows of each
source as the study does, then runs the cells of ``--regions`` × ``--entries`` exactly as
``study.sweep.run_batch`` does (``study.simrun.run_window``) and prints, per source, cells/s and CPU
milliseconds per cell, plus the calibration CPU per window. Bailian ``deepseek-r1`` (long reasoning
outputs, many decode steps) dominates the full study's CPU.

    .venv/bin/python -m benchmarks bench_study_cells [--windows 2] [--entries study] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections import defaultdict
from collections.abc import Sequence

from sagegate.study.calibrate import Calibration, calibrate_window
from sagegate.study.config import StudyConfig
from sagegate.study.simrun import Entry, run_window
from sagegate.study.sweep import panel
from sagegate.study.windows import Window, load_rows, make_windows, max_tokens_for

ENTRIES = (
    "vllm-v1@engine",
    "vllm-v0@engine",
    "sarathi@engine",
    "slai@engine",
    "edf@engine",
    "ssjf@engine",
    "sagesched@engine",
    "fastserve@engine",
    "fcfs@gateway",
    "sagesched@gateway",
    "ssjf@gateway",
    "vtc@gateway",
)
"""A spread of code paths: every engine variant, static/dynamic/preemptive engine policies, gateway."""


def load_windows(cfg: StudyConfig, sources: Sequence[str] | None, count: int) -> dict[str, list[Window]]:
    """The first ``count`` windows of each chosen source (the study's own corpus)."""
    cap = max_tokens_for(cfg)
    out = {}
    for spec in cfg.sources:
        if sources and spec.name not in sources:
            continue
        out[spec.name] = make_windows(load_rows(spec, cfg.seed), spec.name, cfg, cap)[:count]
    return out


def entries_for(arg: str, cfg: StudyConfig) -> list[tuple[Entry, float]]:
    """(entry, prediction error) pairs: ``study`` is the study's own mix of one window × region (the
    panel at the main error plus the robustness re-runs at the other errors), ``all`` the panel."""
    main = cfg.main_error
    if arg in ("all", "study"):
        pairs = [(e, main) for e in panel(cfg)]
        if arg == "study":
            pairs += [(e, err) for e in pairs_entries(cfg) for err in cfg.errors[1:]]
        return pairs
    names = ENTRIES if arg == "default" else arg.split(",")
    return [(Entry.parse(e), main) for e in names]


def pairs_entries(cfg: StudyConfig) -> list[Entry]:
    return [e for e in panel(cfg) if e.label in cfg.robustness]


def run_cell(cfg: StudyConfig, w: Window, cal: Calibration, region: str, entry: Entry, error: float):
    factor = cfg.region_factor(region) * cal.lambda_ref
    return run_window(w.requests, factor, entry, model=cfg.model, gpu=cfg.gpu, seed=w.seed, error=error)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=2, help="windows per source (the first ones)")
    ap.add_argument("--sources", default="", help="comma-separated source names (default: all four)")
    ap.add_argument("--regions", default="KNEE,HIGH_PRESSURE")
    ap.add_argument(
        "--entries",
        default="default",
        help="'default', 'all' (the panel), 'study' (panel + re-runs) or p@level,…",
    )
    ap.add_argument("--profile", default="", help="write a cProfile of the cells (not calibration) here")
    args = ap.parse_args()
    cfg = StudyConfig()
    t0 = time.perf_counter()
    corpus = load_windows(cfg, [s for s in args.sources.split(",") if s], args.windows)
    print(f"corpus: {sum(len(w) for w in corpus.values())} windows in {time.perf_counter() - t0:.1f} s")
    entries = entries_for(args.entries, cfg)
    regions = args.regions.split(",")

    cals: dict[str, Calibration] = {}
    cal_cpu: dict[str, float] = defaultdict(float)
    for source, wins in corpus.items():
        for w in wins:
            c0 = time.process_time()
            cals[w.id] = calibrate_window(w, cfg)
            cal_cpu[source] += time.process_time() - c0

    prof = cProfile.Profile() if args.profile else None
    cpu: dict[str, float] = defaultdict(float)
    cells: dict[str, int] = defaultdict(int)
    per_entry: dict[str, float] = defaultdict(float)
    for source, wins in corpus.items():
        for w in wins:
            for region in regions:
                for entry, error in entries:
                    c0 = time.process_time()
                    if prof is not None:
                        prof.enable()
                    run_cell(cfg, w, cals[w.id], region, entry, error)
                    if prof is not None:
                        prof.disable()
                    spent = time.process_time() - c0
                    cpu[source] += spent
                    cells[source] += 1
                    per_entry[f"{source[:12]:12s} {entry.label} {error:g}"] += spent
    print(f"{'source':22s} {'cells':>6s} {'CPU s':>8s} {'cells/s':>8s} {'ms/cell':>8s} {'calib s/win':>11s}")
    for source in corpus:
        n, s = cells[source], cpu[source]
        print(
            f"{source:22s} {n:6d} {s:8.2f} {n / s:8.1f} {1000 * s / n:8.1f} "
            f"{cal_cpu[source] / len(corpus[source]):11.2f}"
        )
    n, s = sum(cells.values()), sum(cpu.values())
    print(
        f"{'all':22s} {n:6d} {s:8.2f} {n / s:8.1f} {1000 * s / n:8.1f} {sum(cal_cpu.values()):11.2f} (total)"
    )
    print("slowest source×entry (CPU s over its cells):")
    for label, s in sorted(per_entry.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {label:40s} {s:7.2f}")
    if prof is not None:
        prof.dump_stats(args.profile)
        print(f"profile written to {args.profile}")


if __name__ == "__main__":
    main()
