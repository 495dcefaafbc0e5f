"""The sweep: every applicable (policy, level) of the panel × windows × regions × predictors.

A *cell* is one simulation: a window at one region's compression factor, one entry of the panel, one
predictor. Cells are deterministic (the window's seed seeds the predictor and any randomised policy),
so every executor produces the same rows. Tasks are batched by (window, region) so a window's
requests travel to a worker once per batch. Finished cells are appended to a JSON-lines log keyed by
cell id; a rerun skips them (resume), and :func:`write_results_csv` writes the canonical results file,
one row per cell sorted by id, whatever order the cells finished in.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagegate.study.calibrate import Calibration
from sagegate.study.config import StudyConfig
from sagegate.study.executors import Executor
from sagegate.study.metrics import METRIC_NAMES, cell_metrics
from sagegate.study.simrun import Entry, run_window
from sagegate.study.windows import Window

if TYPE_CHECKING:
    from sagegate.core.distribution import LengthDistribution

NOISY = "noisy-oracle"
SEMANTIC = "semantic"
VLLM_ALONE = Entry("vllm-v1", "engine")
"""vLLM alone: its default (v1) scheduler, FCFS, no gateway queue. ``fcfs@engine`` is the same run."""


def panel(cfg: StudyConfig) -> list[Entry]:
    """Every registered policy (or ``cfg.policies``) at every level it supports.

    ``fcfs@engine`` is left out when ``vllm-v1@engine`` is in: both are vLLM's default engine with
    FCFS, so their cells are identical and one would only add a tie to every ranking.
    """
    from sagegate.policies.registry import registry

    reg = registry()
    names = sorted(reg) if cfg.policies is None else list(cfg.policies)
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; valid: {', '.join(sorted(reg))}")
    entries = [Entry(n, lvl) for n in names for lvl in ("gateway", "engine") if lvl in reg[n].cls.levels]
    if VLLM_ALONE in entries:
        entries = [e for e in entries if e != Entry("fcfs", "engine")]
    return entries


def depends_on_prediction(entry: Entry) -> bool:
    """Whether the entry's behaviour reads the predictor: every gateway entry (the admission charge
    reads it) and engine entries whose policy does."""
    from sagegate.policies.capabilities import Capability
    from sagegate.policies.registry import registry

    return entry.level == "gateway" or Capability.USES_PREDICTION in registry()[entry.policy].cls.capabilities


def predictor_label(predictor: str, error: float) -> str:
    return f"{predictor}:{error:g}" if predictor == NOISY else predictor


@dataclass(frozen=True)
class Cell:
    source: str
    window: int
    region: str
    entry: Entry
    predictor: str = NOISY
    error: float = 0.2

    @property
    def id(self) -> str:
        pred = predictor_label(self.predictor, self.error)
        return f"{self.source}/w{self.window:02d}/{self.region}/{self.entry.label}/{pred}"


@dataclass
class Batch:
    """The cells of one (window, region): what one worker task runs."""

    window: Window
    region: str
    factor: float
    utilisation: float
    cells: list[Cell]
    model: str
    gpu: str
    dists: Mapping[int, LengthDistribution] | None = field(default=None)


def plan(
    cfg: StudyConfig,
    corpus: Mapping[str, Sequence[Window]],
    calibrations: Mapping[str, Calibration],
    entries: Sequence[Entry],
    *,
    skip: Iterable[str] = (),
    semantic: Mapping[str, Mapping[int, LengthDistribution]] | None = None,
) -> list[Batch]:
    """Batches of the cells not in ``skip``; ``semantic`` maps window id → precomputed distributions.

    Order: every main-setting batch first (so an interrupted run has the core study), then the
    prediction-error re-runs, then the semantic cells; within each group the windows with the most
    output tokens (the slowest to simulate) first, so the pool's tail is short.
    """
    done = set(skip)
    main = cfg.main_error
    rerun = [e for e in entries if e.label in cfg.robustness]
    for e in rerun:
        if not depends_on_prediction(e):
            raise ValueError(f"{e.label} reads no prediction: re-running it at other errors changes nothing")
    groups: list[list[Batch]] = [[], [], []]
    for windows in corpus.values():
        for w in windows:
            cal = calibrations[w.id]
            dists = None if semantic is None else semantic.get(w.id)
            for region, mult in cfg.regions:
                factor = cal.factor(cfg.region_anchor, mult)
                sets: list[tuple[list[Cell], Mapping[int, LengthDistribution] | None]] = [
                    ([Cell(w.source, w.index, region, e, NOISY, main) for e in entries], None),
                    (
                        [
                            Cell(w.source, w.index, region, e, NOISY, err)
                            for e in rerun
                            for err in cfg.errors[1:]
                        ],
                        None,
                    ),
                    (
                        [
                            Cell(w.source, w.index, region, e, SEMANTIC, main)
                            for e in entries
                            if dists is not None and depends_on_prediction(e)
                        ],
                        dists,
                    ),
                ]
                for group, (cells, d) in zip(groups, sets, strict=True):
                    todo = [c for c in cells if c.id not in done]
                    if todo:
                        group.append(
                            Batch(w, region, factor, cal.utilisation(factor), todo, cfg.model, cfg.gpu, d)
                        )
    out: list[Batch] = []
    for group in groups:
        out += sorted(group, key=lambda b: (-sum(r.output_tokens for r in b.window.requests), b.cells[0].id))
    return out


def run_batch(batch: Batch) -> list[dict[str, Any]]:
    """Simulate every cell of ``batch``; one row per cell (metrics and the cell's coordinates)."""
    rows = []
    for cell in batch.cells:
        res = run_window(
            batch.window.requests,
            batch.factor,
            cell.entry,
            model=batch.model,
            gpu=batch.gpu,
            seed=batch.window.seed,
            predictor=cell.predictor,
            error=cell.error,
            dists=batch.dists,
        )
        work = list(batch.window.requests)
        row: dict[str, Any] = {
            "cell": cell.id,
            "source": cell.source,
            "window": cell.window,
            "region": cell.region,
            "factor": batch.factor,
            "utilisation": batch.utilisation,
            "policy": cell.entry.policy,
            "level": cell.entry.level,
            "entry": cell.entry.label,
            "predictor": cell.predictor,
            "error": cell.error,
        }
        row.update(cell_metrics(work, res.records, sum(res.engine_preemptions)))
        rows.append(row)
    return rows


COLUMNS: tuple[str, ...] = (
    "cell",
    "source",
    "window",
    "region",
    "factor",
    "utilisation",
    "policy",
    "level",
    "entry",
    "predictor",
    "error",
    *METRIC_NAMES,
)


class ResultStore:
    """The append-only JSON-lines log of finished cells (NaN written as null)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[dict[str, Any]]:
        """Every logged row, the last one per cell id winning; a torn last line is ignored."""
        if not self.path.exists():
            return []
        out: dict[str, dict[str, Any]] = {}
        with self.path.open() as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out[row["cell"]] = {k: (math.nan if v is None else v) for k, v in row.items()}
        return list(out.values())

    def done(self) -> set[str]:
        return {r["cell"] for r in self.rows()}

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            for row in rows:
                fh.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
            fh.flush()


def _jsonable(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def run_batch_timed(batch: Batch) -> tuple[list[dict[str, Any]], float]:
    """:func:`run_batch` and the CPU seconds it took (kept out of the rows: rows are deterministic)."""
    t0 = time.process_time()
    rows = run_batch(batch)
    return rows, time.process_time() - t0


def run_sweep(
    batches: Sequence[Batch],
    executor: Executor,
    store: ResultStore,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, float]:
    """Run ``batches`` on ``executor``, logging each batch's rows as it finishes; returns the cells
    run and the CPU seconds the workers spent on them."""
    total = sum(len(b.cells) for b in batches)
    finished = 0
    cpu = 0.0
    for rows, spent in executor.map_unordered(run_batch_timed, batches):
        store.append(rows)
        finished += len(rows)
        cpu += spent
        if progress is not None:
            progress(finished, total)
    return finished, cpu


def write_results_csv(rows: Iterable[Mapping[str, Any]], path: Path) -> None:
    """One row per cell, sorted by cell id, floats in their shortest exact form (``repr``)."""
    ordered = sorted(rows, key=lambda r: r["cell"])
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in ordered:
            w.writerow([_csv_value(r.get(c)) for c in COLUMNS])


def _csv_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return str(v)
