"""BurstGPT traces: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (seconds).

Release 3 inserts ``Session ID,Elapsed time`` after ``Timestamp``; columns are found by name so both
layouts read the same way. Failed requests appear as rows with zero response (or request) tokens:
they are dropped and counted in ``ReadStats.dropped_zero_tokens``. Model, log type and session id go
to ``extra``; ``tenant_column`` (e.g. ``"Model"`` or ``"Session ID"``) makes one of them the tenant.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from core.request import TraceRequest
from loadgen.readers.common import ReadStats, TraceFormatError, open_text, parse_tokens

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
    out: list[TraceRequest] = []
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, "empty file; expected a BurstGPT header")
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
        for row in reader:
            if not row:
                continue
            if limit is not None and len(out) >= limit:
                break
            line = reader.line_num
            if len(row) != width:
                raise TraceFormatError(path, line, f"expected {width} fields, got {len(row)}")
            try:
                arrival = float(row[i_ts])
            except ValueError:
                raise TraceFormatError(path, line, f"Timestamp: not a number: {row[i_ts]!r}") from None
            if not math.isfinite(arrival):
                raise TraceFormatError(path, line, f"Timestamp: not finite: {row[i_ts]!r}")
            column = header[i_in]
            try:
                prompt = parse_tokens(row[i_in])
                column = header[i_out]
                output = parse_tokens(row[i_out])
            except ValueError as exc:
                raise TraceFormatError(path, line, f"{column.strip()}: {exc}") from None
            stats.rows += 1
            if prompt == 0 or output == 0:
                stats.dropped_zero_tokens += 1
                continue
            extra: dict[str, object] = {key: row[i].strip() for i, key in extras}
            if i_elapsed is not None and row[i_elapsed].strip():
                try:
                    extra["elapsed_s"] = float(row[i_elapsed])
                except ValueError:
                    raise TraceFormatError(
                        path, line, f"Elapsed time: not a number: {row[i_elapsed]!r}"
                    ) from None
            out.append(
                TraceRequest(
                    arrival_s=arrival,
                    prompt_tokens=prompt,
                    output_tokens=output,
                    tenant=row[i_tenant].strip() if i_tenant is not None else "default",
                    extra=extra,
                )
            )
    return out
