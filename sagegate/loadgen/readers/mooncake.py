"""Mooncake traces: JSON lines ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": []}``.

Each hash id names one 512-token prompt block (equal ids mean a shared prefix), so ``hash_ids`` is kept
as a tuple for prefix-cache modelling. The same format is used by AIBrix, NVIDIA Dynamo and AIPerf;
other keys those tools add are kept in ``extra``.
"""

from __future__ import annotations

from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers.common import (
    ReadStats,
    collect_requests,
    iter_json_lines,
    json_seconds,
    json_tokens,
    require_keys,
)

REQUIRED = ("timestamp", "input_length", "output_length")


def hash_id_tuple(value: object) -> tuple[int, ...]:
    """A list of integer block ids as a tuple (booleans and non-integers rejected)."""
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ValueError(f"hash_ids must be a list of integers, got {str(value)[:80]}")
    return tuple(value)


def _parse(obj: dict[str, object]) -> TraceRequest:
    require_keys(obj, REQUIRED)
    return TraceRequest(
        arrival_s=json_seconds(obj["timestamp"], "timestamp") / 1000.0,
        prompt_tokens=json_tokens(obj["input_length"], "input_length"),
        output_tokens=json_tokens(obj["output_length"], "output_length"),
        hash_ids=hash_id_tuple(obj["hash_ids"]) if obj.get("hash_ids") is not None else None,
        extra={k: v for k, v in obj.items() if k not in REQUIRED and k != "hash_ids"},
    )


def read(path: Path, stats: ReadStats, *, limit: int | None = None) -> list[TraceRequest]:
    """Requests in file order (the first ``limit`` valid lines), arrivals in seconds, not rebased."""
    return collect_requests(path, stats, iter_json_lines(path), _parse, limit=limit)
