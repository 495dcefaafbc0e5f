"""What every reader shares: the error type, the per-read statistics, strict field parsing and the
read loop (:func:`collect_requests`), so every format counts, drops and stops the same way.

Readers fail loudly on a malformed row (naming file and 1-based line, header counted) because a
silently skipped row changes a workload's rate and a study's result; the only rows dropped on purpose
are requests with zero prompt or output tokens (failed requests in BurstGPT), and those are counted.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

from sagegate.core.request import TraceRequest

if TYPE_CHECKING:
    import numpy as np

Row = TypeVar("Row")


class TraceFormatError(ValueError):
    """A trace file that does not match its format; the message names the file, the line and the fault."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}, line {line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


@dataclass(slots=True)
class ReadStats:
    """What a read did besides returning requests, so callers can report dropped or skipped input.

    ``rows`` counts source records parsed (file rows, JSON lines or generated ServeGen arrivals);
    ``dropped_zero_tokens`` the ones dropped for a zero prompt or output length; ``skipped_clients``
    the ServeGen clients without a dataset file; ``skipped_windows`` the ServeGen windows with a
    non-zero rate whose length distributions are empty.
    """

    path: str
    fmt: str
    rows: int = 0
    kept: int = 0
    dropped_zero_tokens: int = 0
    skipped_clients: list[int] = field(default_factory=list)
    skipped_windows: int = 0


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes (whatever its name)."""
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_text(path: Path) -> IO[str]:
    """Open a text trace, transparently decompressing gzip; ``newline=""`` as the csv module wants."""
    if is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def parse_tokens(text: str) -> int:
    """A token count from a CSV field: a non-negative integer (``"12.0"`` is accepted as 12)."""
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise ValueError(f"not an integer: {text!r}") from None
        if not f.is_integer():
            raise ValueError(f"not an integer: {text!r}") from None
        value = int(f)
    if value < 0:
        raise ValueError(f"negative: {text!r}")
    return value


def json_tokens(value: object, name: str) -> int:
    """A token count from a JSON value: a non-negative integer (an integral float is accepted)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return int(value)


def json_seconds(value: object, name: str) -> float:
    """A finite time in seconds (or milliseconds) from a JSON value."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """``(line number, object)`` for each non-blank line of a (possibly gzipped) JSON-lines file."""
    with open_text(path) as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    path, lineno, f"invalid JSON: {exc.msg} (column {exc.colno})"
                ) from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


@contextmanager
def csv_rows(path: Path, expected: str) -> Iterator[tuple[list[str], Iterator[tuple[int, list[str]]]]]:
    """The header of a (possibly gzipped) CSV trace and its non-blank rows as ``(line number, row)``.

    An empty file fails with ``empty file; expected <expected>``.
    """
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, f"empty file; expected {expected}")
        yield header, ((reader.line_num, row) for row in reader if row)


def require_keys(obj: dict[str, object], keys: Sequence[str]) -> None:
    """Fail (``ValueError``) when a JSON object lacks any of ``keys``."""
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"missing key(s) {missing}")


def in_column(column: str, parse: Callable[[str], Row], text: str) -> Row:
    """``parse(text)``, its ``ValueError`` prefixed with the column's name."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{column.strip()}: {exc}") from None


def collect_requests(
    path: Path,
    stats: ReadStats,
    rows: Iterable[tuple[int | None, Row]],
    parse: Callable[[Row], TraceRequest],
    *,
    limit: int | None = None,
) -> list[TraceRequest]:
    """The read loop every reader shares: the requests ``parse`` makes of ``rows``, in order.

    Each row parsed counts in ``stats.rows``; a request with no prompt or output tokens is dropped and
    counted in ``stats.dropped_zero_tokens``; reading stops once ``limit`` requests are kept (the rest
    of the file is not parsed). A ``ValueError`` from ``parse`` becomes a :class:`TraceFormatError`
    naming the file and the row's line.
    """
    out: list[TraceRequest] = []
    for line, row in rows:
        if limit is not None and len(out) >= limit:
            break
        try:
            req = parse(row)
        except ValueError as exc:
            raise TraceFormatError(path, line, str(exc)) from None
        stats.rows += 1
        if req.prompt_tokens <= 0 or req.output_tokens <= 0:
            stats.dropped_zero_tokens += 1
            continue
        out.append(req)
    return out


def check_clock(arrivals_from: Sequence[float] | None, rate: float | None, what: str) -> None:
    """A reader of ``what`` (records without timestamps) needs exactly one clock: times or a rate."""
    if (arrivals_from is None) == (rate is None):
        raise ValueError(f"{what} have no timestamps: pass exactly one of rate= or arrivals_from=")


def attach_times(
    n: int,
    *,
    arrivals_from: Sequence[float] | None,
    rate: float | None,
    arrival: str,
    cv: float,
    rng: np.random.Generator,
) -> list[float]:
    """``n`` arrival times: the first ``n`` of ``arrivals_from`` (every one finite), or drawn from
    ``rng`` at ``rate`` a second (``arrival`` poisson, or gamma with ``cv``)."""
    if arrivals_from is not None:
        times = [float(t) for t in arrivals_from[:n]]
        if not all(math.isfinite(t) for t in times):
            raise ValueError("arrivals_from holds a non-finite time")
        return times
    from sagegate.loadgen.synthetic import arrival_times

    assert rate is not None
    return arrival_times(n, rate=rate, arrival=arrival, cv=cv, rng=rng).tolist()
