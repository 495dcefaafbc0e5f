"""The study end to end: corpus → calibration → sweep → results file → report.

I/O lives here: ``OUT/config.json`` (the exact configuration), ``OUT/calibration.jsonl`` and
``OUT/cells.jsonl`` (append-only logs; a rerun skips what they hold), ``OUT/cells.csv`` (the results
file, one row per cell), ``OUT/timing.json`` (wall times, kept out of the results so that results do
not depend on the machine), then the report (``OUT/report.md`` and ``OUT/figures/``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagegate.core.request import TraceRequest
from sagegate.study.calibrate import Calibration, calibrate_window
from sagegate.study.config import StudyConfig
from sagegate.study.executors import Executor
from sagegate.study.sweep import ResultStore, panel, plan, run_sweep, write_results_csv
from sagegate.study.windows import Window, load_rows, make_windows, max_tokens_for, valid_rows

if TYPE_CHECKING:
    from sagegate.core.distribution import LengthDistribution


class ConfigMismatch(RuntimeError):
    """``OUT`` holds results of a different configuration: resuming would mix them."""


@dataclass
class SourceInfo:
    name: str
    rows: int
    valid: int
    windows: int
    tenants: int
    has_text: bool
    note: str


def calibrate_task(task: tuple[Window, StudyConfig]) -> tuple[dict[str, Any], float]:
    """One window's calibration and the CPU seconds it took."""
    window, cfg = task
    t0 = time.process_time()
    cal = calibrate_window(window, cfg).to_dict()
    return cal, time.process_time() - t0


def _log_progress(label: str, log: Callable[[str], None]) -> Callable[[int, int], None]:
    t0 = time.perf_counter()
    last = [0.0]

    def tick(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] < 10.0 and done < total:
            return
        last[0] = now
        el = now - t0
        eta = el / done * (total - done) if done else float("nan")
        log(
            f"{label}: {done}/{total} ({100 * done / max(total, 1):.0f}%), {el:.0f} s elapsed, ~{eta:.0f} "
            "s left"
        )

    return tick


def _check_config(out: Path, cfg: StudyConfig, resume: bool) -> None:
    path = out / "config.json"
    logs = [out / "cells.jsonl", out / "calibration.jsonl", out / "semantic.jsonl"]
    if not resume:
        for p in logs:
            p.unlink(missing_ok=True)
    elif path.exists() and any(p.exists() for p in logs):
        old = json.loads(path.read_text())
        if old != json.loads(json.dumps(cfg.to_dict())):
            raise ConfigMismatch(
                f"{out} holds results of another configuration; use a new --out or --no-resume"
            )
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _semantic(
    cfg: StudyConfig,
    corpus: Mapping[str, Sequence[Window]],
    rows_by_source: Mapping[str, Sequence[TraceRequest]],
    out: Path,
    say: Callable[[str], None],
) -> tuple[dict[str, Mapping[int, LengthDistribution]], int]:
    """Semantic predictions of every window with text: those logged in ``OUT/semantic.jsonl``, the
    rest computed (one history warm-up per source) and logged. Returns them and the prompts embedded."""
    from sagegate.study.semantic import PredictionLog, history_for, semantic_distributions

    log = PredictionLog(out / "semantic.jsonl")
    dists: dict[str, Mapping[int, LengthDistribution]] = dict(log.load())
    embedded = 0
    for spec in cfg.sources:
        wins = corpus[spec.name]
        todo = [w for w in wins if w.has_text and w.id not in dists]
        if not todo:
            continue
        hist = history_for(spec, rows_by_source[spec.name], wins, cfg)
        n = len({r.prompt for r in hist if r.prompt}) + len({r.prompt for w in todo for r in w.requests})
        say(
            f"semantic: {spec.name}: warming with {len(hist)} requests, predicting {len(todo)} windows "
            f"({n} prompts)"
        )
        t0 = time.perf_counter()
        got = semantic_distributions(hist, todo, config=cfg.semantic_config)
        say(f"semantic: {spec.name}: {n} prompts embedded in {time.perf_counter() - t0:.0f} s")
        log.append(todo, got, cfg.main_error)
        dists.update(got)
        embedded += n
    return dists, embedded


def run_study(
    cfg: StudyConfig,
    out: Path,
    executor: Executor,
    *,
    resume: bool = True,
    log: Callable[[str], None] | None = None,
    report: bool = True,
) -> dict[str, float]:
    """Run (or resume) the study into ``out``; returns the wall time of each phase in seconds."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    _check_config(out, cfg, resume)
    timing: dict[str, float] = {}
    t_all = t0 = time.perf_counter()

    cap = max_tokens_for(cfg)
    corpus: dict[str, list[Window]] = {}
    infos: list[SourceInfo] = []
    rows_by_source: dict[str, list[TraceRequest]] = {}
    for spec in cfg.sources:
        raw = load_rows(spec, cfg.seed)
        rows = valid_rows(sorted(raw, key=lambda r: r.arrival_s), cap)
        wins = make_windows(rows, spec.name, cfg, cap)
        corpus[spec.name] = wins
        rows_by_source[spec.name] = rows
        tenants = len({r.tenant for w in wins for r in w.requests})
        text = bool(wins) and all(w.has_text for w in wins)
        infos.append(SourceInfo(spec.name, len(raw), len(rows), len(wins), tenants, text, spec.note))
        say(f"corpus: {spec.name}: {len(raw)} rows, {len(rows)} valid, {len(wins)} windows")
    timing["corpus_s"] = time.perf_counter() - t0
    (out / "sources.json").write_text(json.dumps([asdict(i) for i in infos], indent=2) + "\n")

    t0 = time.perf_counter()
    cal_log = out / "calibration.jsonl"
    cals = {c["window"]: Calibration(**c) for c in _read_jsonl(cal_log)}
    todo = [(w, cfg) for ws in corpus.values() for w in ws if w.id not in cals]
    say(f"calibration: {len(cals)} windows logged, {len(todo)} to run")
    tick = _log_progress("calibration", say)
    with cal_log.open("a") as fh:
        cpu = 0.0
        for i, (c, spent) in enumerate(executor.map_unordered(calibrate_task, todo), 1):
            cpu += spent
            fh.write(json.dumps(c) + "\n")
            fh.flush()
            cals[str(c["window"])] = Calibration(**c)
            tick(i, len(todo))
    timing["calibration_s"] = time.perf_counter() - t0
    timing["calibration_cpu_s"] = cpu

    semantic = None
    if cfg.semantic:
        t0 = time.perf_counter()
        semantic, embedded = _semantic(cfg, corpus, rows_by_source, out, say)
        timing["semantic_s"] = time.perf_counter() - t0
        timing["semantic_embeddings"] = float(embedded)

    t0 = time.perf_counter()
    store = ResultStore(out / "cells.jsonl")
    entries = panel(cfg)
    done = store.done()
    batches = plan(cfg, corpus, cals, entries, skip=done, semantic=semantic)
    n_cells = sum(len(b.cells) for b in batches)
    say(
        f"sweep: {len(entries)} entries, {len(done)} cells logged, {n_cells} to run in {len(batches)} batches"
    )
    _, sweep_cpu = run_sweep(batches, executor, store, _log_progress("sweep", say))
    timing["sweep_s"] = time.perf_counter() - t0
    timing["sweep_cpu_s"] = sweep_cpu
    timing["cells_run"] = float(n_cells)

    wanted = {c.id for b in plan(cfg, corpus, cals, entries, semantic=semantic) for c in b.cells}
    results = [r for r in store.rows() if r["cell"] in wanted]
    write_results_csv(results, out / "cells.csv")
    timing["cells_total"] = float(len(results))
    timing["simulate_total_s"] = time.perf_counter() - t_all
    if report:
        from sagegate.study.report import write_report

        t0 = time.perf_counter()
        write_report(out, cfg, results, list(cals.values()), infos, timing)
        timing["report_s"] = time.perf_counter() - t0
    timing["total_s"] = time.perf_counter() - t_all
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    return timing
