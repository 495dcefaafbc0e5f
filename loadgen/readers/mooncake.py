"""Mooncake traces: JSON lines ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": []}``.

Each hash id names one 512-token prompt block (equal ids mean a shared prefix), so ``hash_ids`` is kept
as a tuple for prefix-cache modelling. The same format is used by AIBrix, NVIDIA Dynamo and AIPerf;
other keys those tools add are kept in ``extra``.
"""

from __future__ import annotations

from pathlib import Path

from core.request import TraceRequest
from loadgen.readers.common import ReadStats, TraceFormatError, iter_json_lines, json_seconds, json_tokens

REQUIRED = ("timestamp", "input_length", "output_length")


def hash_id_tuple(value: object) -> tuple[int, ...]:
    """A list of integer block ids as a tuple (booleans and non-integers rejected)."""
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ValueError(f"hash_ids must be a list of integers, got {str(value)[:80]}")
    return tuple(value)


def read(path: Path, stats: ReadStats, *, limit: int | None = None) -> list[TraceRequest]:
    """Requests in file order (the first ``limit`` valid lines), arrivals in seconds, not rebased."""
    out: list[TraceRequest] = []
    for lineno, obj in iter_json_lines(path):
        if limit is not None and len(out) >= limit:
            break
        missing = [k for k in REQUIRED if k not in obj]
        if missing:
            raise TraceFormatError(path, lineno, f"missing key(s) {missing}")
        try:
            arrival = json_seconds(obj["timestamp"], "timestamp") / 1000.0
            prompt = json_tokens(obj["input_length"], "input_length")
            output = json_tokens(obj["output_length"], "output_length")
            hashes = hash_id_tuple(obj["hash_ids"]) if obj.get("hash_ids") is not None else None
        except ValueError as exc:
            raise TraceFormatError(path, lineno, str(exc)) from None
        stats.rows += 1
        if prompt == 0 or output == 0:
            stats.dropped_zero_tokens += 1
            continue
        extra = {k: v for k, v in obj.items() if k not in REQUIRED and k != "hash_ids"}
        out.append(
            TraceRequest(
                arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, hash_ids=hashes, extra=extra
            )
        )
    return out
