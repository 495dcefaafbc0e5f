"""ServeGen per-client workload models (Alibaba Bailian): a folder of ``chunk-N-trace.csv`` and
``chunk-N-dataset.json`` per client N, from which requests for a time slice are generated.

``chunk-N-trace.csv`` (no header) has one row per window: ``window_start_s, rate_rps, cv, distribution,
param1, param2``; ``distribution`` is the fitted inter-arrival law (``Gamma``, ``Weibull``,
``Exponential``) and a silent window has rate 0. ``chunk-N-dataset.json`` maps window starts (strings,
possibly coarser than the trace's windows) to ``input_tokens`` / ``output_tokens`` (and for reasoning
models ``reason_ratio``) fields holding Python dict literals ``{value: probability}``.

Generation, per client and window overlapping the slice:

* gaps come from the fitted law's *shape* (``param1``) rescaled to unit mean and then to the window's
  rate × ``rate_scale``: a scale family rescaled to a given mean no longer depends on its scale
  parameter, so ``param2`` is not needed; the law's CV is the shape's and matches the ``cv`` column.
  A window with a rate but no law falls back to a gamma with the ``cv`` column's CV.
* the first arrival is drawn from the stationary (equilibrium) renewal start, so the expected count in
  a window is exactly rate × duration even for heavy-tailed laws;
* lengths (and ``reason_ratio``, kept in ``extra``) are drawn from the dataset window at or before the
  trace window (parsed with ``ast.literal_eval``); a window whose distributions are empty is skipped
  and counted in ``ReadStats.skipped_windows``;
* each (client, window) draws from its own generators seeded by ``(seed, client, window)``, so a
  client's requests do not depend on which other clients are selected, and a longer slice's arrivals
  extend a shorter one's.

Clients without a dataset file are skipped (``ReadStats.skipped_clients``); tenant is ``client-N``.
"""

from __future__ import annotations

import ast
import bisect
import csv
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers.common import ReadStats, TraceFormatError, collect_requests

if TYPE_CHECKING:
    import numpy as np

TRACE_FILE = re.compile(r"chunk-(\d+)-trace\.csv")
DEFAULT_WINDOW_S = 600.0
LAWS = ("gamma", "weibull", "exponential")


@dataclass(frozen=True, slots=True)
class Window:
    """One row of a client's trace file."""

    start_s: float
    rate: float
    cv: float
    law: str
    shape: float
    line: int


def client_files(folder: Path) -> dict[int, Path]:
    """Client id → its trace file, for every ``chunk-N-trace.csv`` in ``folder``."""
    found = {}
    for p in folder.iterdir():
        m = TRACE_FILE.fullmatch(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: not finite: {text!r}")
    return value


def read_windows(path: Path) -> list[Window]:
    """Every row of a trace file, validated; sorted by window start."""
    rows = []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != 6:
                raise TraceFormatError(path, line, f"expected 6 fields, got {len(row)}")
            try:
                start = _number(row[0], "window_start_s")
                rate = _number(row[1], "rate_rps")
                cv = _number(row[2], "cv")
                law = row[3].strip().lower()
                shape = _number(row[4], "param1") if law else 0.0
                if law:
                    _number(row[5], "param2")
            except ValueError as exc:
                raise TraceFormatError(path, line, str(exc)) from None
            if rate < 0 or cv < 0:
                raise TraceFormatError(path, line, f"negative rate or cv: {row[1]!r}, {row[2]!r}")
            if law and law not in LAWS:
                raise TraceFormatError(path, line, f"unknown distribution {row[3]!r}; expected one of {LAWS}")
            if law in ("gamma", "weibull") and not shape > 0:
                raise TraceFormatError(path, line, f"{row[3]} shape (param1) must be > 0, got {row[4]!r}")
            rows.append(Window(start, rate, cv, law, shape, line))
    rows.sort(key=lambda w: w.start_s)
    return rows


def window_length(windows: Sequence[Window]) -> float:
    """The trace's window length: the smallest gap between consecutive starts (600 s if one row)."""
    gaps = [b.start_s - a.start_s for a, b in itertools.pairwise(windows) if b.start_s > a.start_s]
    return min(gaps) if gaps else DEFAULT_WINDOW_S


class Dataset:
    """A client's length distributions per dataset window, parsed lazily (the files run to megabytes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
        if not isinstance(raw, dict):
            raise TraceFormatError(path, 1, "expected a JSON object keyed by window start")
        try:
            keyed = sorted((float(k), v) for k, v in raw.items())
        except ValueError:
            raise TraceFormatError(path, None, "window keys must be numbers of seconds") from None
        self._starts = [k for k, _ in keyed]
        self._raw = [v for _, v in keyed]
        self._parsed: dict[tuple[int, str], tuple[list[float], list[float]]] = {}

    def window_at(self, t: float) -> int | None:
        """Index of the latest dataset window starting at or before ``t``."""
        i = bisect.bisect_right(self._starts, t) - 1
        return i if i >= 0 else None

    def has(self, i: int, name: str) -> bool:
        entry = self._raw[i]
        return isinstance(entry, dict) and name in entry

    def dist(self, i: int, name: str) -> tuple[list[float], list[float]]:
        """``(values, probabilities)`` of field ``name`` in window ``i`` (empty lists when empty)."""
        key = (i, name)
        if key not in self._parsed:
            self._parsed[key] = self._parse(i, name)
        return self._parsed[key]

    def _parse(self, i: int, name: str) -> tuple[list[float], list[float]]:
        where = f"window {self._starts[i]:g} field {name!r}"
        entry = self._raw[i]
        if not isinstance(entry, dict) or not isinstance(entry.get(name), str):
            raise TraceFormatError(self.path, None, f"{where}: expected a string holding a dict literal")
        try:
            table = ast.literal_eval(entry[name])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise TraceFormatError(self.path, None, f"{where}: not a Python dict literal") from None
        if not isinstance(table, dict):
            raise TraceFormatError(self.path, None, f"{where}: expected a dict, got {type(table).__name__}")
        values, probs = [], []
        for v, p in table.items():
            ok = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (v, p))
            if not ok or not math.isfinite(v) or not math.isfinite(p) or p < 0:
                raise TraceFormatError(self.path, None, f"{where}: bad entry {v!r}: {p!r}")
            values.append(float(v))
            probs.append(float(p))
        if values and not sum(probs) > 0:
            raise TraceFormatError(self.path, None, f"{where}: probabilities sum to zero")
        return values, probs


def _unit_sampler(law: str, shape: float) -> tuple[Callable[..., np.ndarray], Callable[..., float]]:
    """Samplers of unit-mean gaps and of the stationary first-arrival offset for one fitted law."""
    if law == "gamma":

        def gaps(rng: np.random.Generator, n: int) -> np.ndarray:
            return rng.gamma(shape, 1.0 / shape, n)

        def biased(rng: np.random.Generator) -> float:  # length-biased Gamma(k, θ) is Gamma(k + 1, θ)
            return float(rng.gamma(shape + 1.0, 1.0 / shape))

    elif law == "weibull":
        mean = math.exp(math.lgamma(1.0 + 1.0 / shape))

        def gaps(rng: np.random.Generator, n: int) -> np.ndarray:
            return rng.weibull(shape, n) / mean

        def biased(rng: np.random.Generator) -> float:  # x = y^(1/k) with y ~ Gamma(1 + 1/k)
            return float(rng.gamma(1.0 + 1.0 / shape) ** (1.0 / shape) / mean)

    else:

        def gaps(rng: np.random.Generator, n: int) -> np.ndarray:
            return rng.exponential(1.0, n)

        def biased(rng: np.random.Generator) -> float:
            return float(rng.gamma(2.0))

    return gaps, biased


def window_arrivals(w: Window, rate: float, start: float, end: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in ``[start, end)`` of a renewal process in equilibrium from ``start``."""
    import numpy as np

    law, shape = w.law, w.shape
    if not law:
        law, shape = ("gamma", 1.0 / (w.cv * w.cv)) if w.cv > 0 else ("exponential", 1.0)
    gaps, biased = _unit_sampler(law, shape)
    mean_gap = 1.0 / rate
    first = start + rng.random() * biased(rng) * mean_gap
    if first >= end:
        return np.empty(0)
    expected = (end - first) * rate
    batch = int(expected * 1.1 + 4.0 * math.sqrt(expected) + 16)
    pieces = [np.array([first])]
    last = first
    while last < end:
        piece = last + np.cumsum(gaps(rng, batch)) * mean_gap
        pieces.append(piece)
        last = float(piece[-1])
    times = np.concatenate(pieces)
    return times[times < end]


def _draw(rng: np.random.Generator, dist: tuple[list[float], list[float]], n: int) -> np.ndarray:
    import numpy as np

    values, probs = dist
    p = np.asarray(probs)
    return rng.choice(np.asarray(values), size=n, p=p / p.sum())


@dataclass(frozen=True, slots=True)
class _Drawn:
    """One (client, window)'s generated arrivals, lengths and reasoning ratios, indexed alike."""

    times: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    ratios: np.ndarray | None
    tenant: str

    def request(self, k: int) -> TraceRequest:
        extra: dict[str, object] = {} if self.ratios is None else {"reason_ratio": float(self.ratios[k])}
        return TraceRequest(
            arrival_s=float(self.times[k]),
            prompt_tokens=int(self.prompts[k]),
            output_tokens=int(self.outputs[k]),
            tenant=self.tenant,
            extra=extra,
        )


def read(
    path: Path,
    stats: ReadStats,
    *,
    limit: int | None = None,
    seed: int = 0,
    start_s: float = 0.0,
    duration_s: float = DEFAULT_WINDOW_S,
    clients: Sequence[int] | None = None,
    rate_scale: float = 1.0,
) -> list[TraceRequest]:
    """Requests of the slice ``[start_s, start_s + duration_s)`` in trace seconds, not rebased.

    ``limit`` is applied by the caller after sorting (generation is per client, not in time order).
    """
    import numpy as np

    del limit
    if not path.is_dir():
        raise TraceFormatError(path, None, "a ServeGen workload is a folder of chunk-N-trace.csv files")
    if not duration_s > 0 or not math.isfinite(duration_s) or not math.isfinite(start_s):
        raise ValueError(f"need a finite start_s and duration_s > 0, got {start_s}, {duration_s}")
    if not rate_scale > 0 or not math.isfinite(rate_scale):
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    traces = client_files(path)
    if not traces:
        raise TraceFormatError(path, None, "no chunk-N-trace.csv files in this folder")
    if clients is not None:
        unknown = sorted(set(clients) - set(traces))
        if unknown:
            raise ValueError(f"client(s) {unknown} have no trace file in {path}")
        traces = {c: traces[c] for c in sorted(set(clients))}
    slice_end = start_s + duration_s
    out: list[TraceRequest] = []
    for client, trace_path in traces.items():
        dataset_path = path / f"chunk-{client}-dataset.json"
        if not dataset_path.exists():
            stats.skipped_clients.append(client)
            continue
        windows = read_windows(trace_path)
        length = window_length(windows)
        active = [w for w in windows if w.rate > 0 and w.start_s < slice_end and w.start_s + length > start_s]
        if not active:
            continue
        dataset = Dataset(dataset_path)
        tenant = f"client-{client}"
        for w in active:
            i = dataset.window_at(w.start_s)
            if i is None:
                raise TraceFormatError(
                    dataset_path,
                    None,
                    f"no dataset window at or before {w.start_s:g} s (trace line {w.line})",
                )
            inputs, outputs = dataset.dist(i, "input_tokens"), dataset.dist(i, "output_tokens")
            if not inputs[0] or not outputs[0]:
                stats.skipped_windows += 1
                continue
            streams = np.random.SeedSequence([seed, client, round(w.start_s)]).spawn(4)
            gap_rng, in_rng, out_rng, ratio_rng = (np.random.default_rng(s) for s in streams)
            end = min(w.start_s + length, slice_end)
            times = window_arrivals(w, w.rate * rate_scale, w.start_s, end, gap_rng)
            n = len(times)
            prompts = _draw(in_rng, inputs, n).astype(np.int64)
            outs = _draw(out_rng, outputs, n).astype(np.int64)
            ratios = None
            if dataset.has(i, "reason_ratio") and dataset.dist(i, "reason_ratio")[0]:
                ratios = _draw(ratio_rng, dataset.dist(i, "reason_ratio"), n)
            drawn = _Drawn(times, prompts, outs, ratios, tenant)
            keep = np.flatnonzero(times >= start_s)
            out += collect_requests(path, stats, ((None, int(k)) for k in keep), drawn.request)
    return out
