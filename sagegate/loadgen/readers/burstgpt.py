"""BurstGPT traces: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (seconds).

Release 3 inserts ``Session ID,Elapsed time`` after ``Timestamp``; columns are found by name so both
layouts read the same way. Failed requests appear as rows with zero response (or request) tokens:
they are dropped and counted in ``ReadStats.dropped_zero_tokens``. Model, log type and session id go
to ``extra``; ``tenant_column`` (e.g. ``"Model"`` or ``"Session ID"``) makes one of them the tenant.
"""

from __future__ import annotations

import math
from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers.common import (
    ReadStats,
    TraceFormatError,
    collect_requests,
    csv_rows,
    in_column,
    parse_tokens,
)

REQUIRED = ("timestamp", "request tokens", "response tokens")
_EXTRA = {"model": "model", "log type": "log_type", "session id": "session_id"}
_ELAPSED = "elapsed time"


def read(
    path: Path,
    stats: ReadStats,
    *,
    limit: int | None = None,
    tenant_column: str | None = None,
) -> list[TraceRequest]:
    """Requests in file order (the first ``limit`` valid rows), arrivals in seconds, not rebased."""
    with csv_rows(path, "a BurstGPT header") as (header, rows):
        names = [h.strip().lower() for h in header]
        missing = [h for h in REQUIRED if h not in names]
        if missing:
            raise TraceFormatError(path, 1, f"header {header!r} lacks column(s) {missing}")
        i_ts, i_in, i_out = (names.index(h) for h in REQUIRED)
        extras = [(names.index(h), key) for h, key in _EXTRA.items() if h in names]
        i_elapsed = names.index(_ELAPSED) if _ELAPSED in names else None
        i_tenant: int | None = None
        if tenant_column is not None:
            if tenant_column.strip().lower() not in names:
                raise ValueError(f"tenant_column {tenant_column!r} is not a column of {path}: {header}")
            i_tenant = names.index(tenant_column.strip().lower())
        width = len(names)

        def parse(row: list[str]) -> TraceRequest:
            if len(row) != width:
                raise ValueError(f"expected {width} fields, got {len(row)}")
            arrival = _timestamp(row[i_ts])
            prompt = in_column(header[i_in], parse_tokens, row[i_in])
            output = in_column(header[i_out], parse_tokens, row[i_out])
            extra: dict[str, object] = {}
            if prompt and output:  # a failed request is dropped: its other fields are not read
                extra = {key: row[i].strip() for i, key in extras}
                if i_elapsed is not None and row[i_elapsed].strip():
                    extra["elapsed_s"] = _elapsed(row[i_elapsed])
            return TraceRequest(
                arrival_s=arrival,
                prompt_tokens=prompt,
                output_tokens=output,
                tenant=row[i_tenant].strip() if i_tenant is not None else "default",
                extra=extra,
            )

        return collect_requests(path, stats, rows, parse, limit=limit)


def _timestamp(text: str) -> float:
    try:
        arrival = float(text)
    except ValueError:
        raise ValueError(f"Timestamp: not a number: {text!r}") from None
    if not math.isfinite(arrival):
        raise ValueError(f"Timestamp: not finite: {text!r}")
    return arrival


def _elapsed(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"Elapsed time: not a number: {text!r}") from None
