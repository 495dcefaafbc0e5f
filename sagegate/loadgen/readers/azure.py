"""Azure LLM inference traces, 2023 and 2024 releases: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Timestamps are parsed by hand (one regex, a per-date cache) rather than by ``datetime`` per row: the
2023 style carries seven fractional digits, which ``strptime`` cannot take, and a week-long 2024 file
has millions of rows. Times are kept relative to the first row's date so float precision stays at
the trace's 0.1 µs resolution.
"""

from __future__ import annotations

import datetime as dt
import re
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

HEADER = ("timestamp", "contexttokens", "generatedtokens")

_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)(?:(Z)|([+-])(\d{2}):?(\d{2}))?")


class TimestampParser:
    """Seconds since midnight (UTC) of the first date seen, for ``2023-11-16 18:15:46.6805900`` and
    ``2024-05-10 00:00:00.009930+00:00`` (``T`` separator, ``Z`` and other offsets also taken)."""

    def __init__(self) -> None:
        self._days: dict[str, int] = {}
        self._base: int | None = None

    def __call__(self, text: str) -> float:
        m = _TS.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"bad timestamp {text!r} (expected e.g. 2023-11-16 18:15:46.6805900)")
        date, hh, mm, ss, _z, sign, oh, om = m.groups()
        hours, minutes, seconds = int(hh), int(mm), float(ss)
        if hours > 23 or minutes > 59 or seconds >= 61:
            raise ValueError(f"bad time of day in {text!r}")
        day = self._days.get(date)
        if day is None:
            try:
                ordinal = dt.date.fromisoformat(date).toordinal()
            except ValueError:
                raise ValueError(f"bad date in {text!r}") from None
            if self._base is None:
                self._base = ordinal
            day = (ordinal - self._base) * 86400
            self._days[date] = day
        secs = day + hours * 3600 + minutes * 60 + seconds
        if sign is not None:
            offset = int(oh) * 3600 + int(om) * 60
            secs -= offset if sign == "+" else -offset
        return secs


def read(path: Path, stats: ReadStats, *, limit: int | None = None) -> list[TraceRequest]:
    """Requests in file order (the first ``limit`` valid rows), arrivals in seconds, not rebased."""
    parse_ts = TimestampParser()
    with csv_rows(path, "header " + ",".join(HEADER)) as (header, rows):
        names = [h.strip().lower() for h in header]
        try:
            i_ts, i_in, i_out = (names.index(h) for h in HEADER)
        except ValueError:
            raise TraceFormatError(
                path, 1, f"header {header!r} lacks TIMESTAMP, ContextTokens or GeneratedTokens"
            ) from None
        width = len(names)

        def parse(row: list[str]) -> TraceRequest:
            if len(row) != width:
                raise ValueError(f"expected {width} fields, got {len(row)}")
            return TraceRequest(
                arrival_s=in_column(header[i_ts], parse_ts, row[i_ts]),
                prompt_tokens=in_column(header[i_in], parse_tokens, row[i_in]),
                output_tokens=in_column(header[i_out], parse_tokens, row[i_out]),
            )

        return collect_requests(path, stats, rows, parse, limit=limit)
