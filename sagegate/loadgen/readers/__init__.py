"""Workload readers: every supported trace format to a list of canonical ``TraceRequest``.

``read_trace`` is the one entry point: it picks the reader (``fmt="auto"`` detects it), keeps the
first ``limit`` requests, sorts by arrival, rebases the first arrival to 0 and numbers rids 0..n-1.
``read_trace_with_stats`` also returns a ``ReadStats`` (rows read, zero-token rows dropped, ServeGen
clients or windows skipped); ``read_trace`` logs the drops at INFO.

Formats: ``azure`` (2023 and 2024 CSV), ``burstgpt`` (both releases), ``mooncake`` (JSON lines with
``hash_ids``), ``jsonl`` (the project's generic JSON lines), ``sharegpt`` (prompt/response pairs; needs
``rate=`` or ``arrivals_from=``), ``sharegpt-sessions`` (multi-turn conversations, each turn's prompt
its whole history; ``rate=`` sessions a second or ``arrivals_from=``, ``think_s``, ``sessions``),
``servegen`` (a per-client model folder; options ``start_s``,
``duration_s``, ``clients``, ``rate_scale``). ``burstgpt`` also takes ``tenant_column``. Options a
format does not know raise ``TypeError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers import azure, burstgpt, jsonl, mooncake, servegen, sharegpt, sharegpt_sessions
from sagegate.loadgen.readers.common import ReadStats, TraceFormatError, check_limit
from sagegate.loadgen.readers.detect import detect_format
from sagegate.loadgen.readers.retime import retime
from sagegate.loadgen.records import rebase

__all__ = [
    "FORMATS",
    "ReadStats",
    "TraceFormatError",
    "detect_format",
    "read_trace",
    "read_trace_with_stats",
    "retime",
]

log = logging.getLogger(__name__)

_READERS: dict[str, Callable[..., list[TraceRequest]]] = {
    "azure": azure.read,
    "burstgpt": burstgpt.read,
    "mooncake": mooncake.read,
    "jsonl": jsonl.read,
    "sharegpt": sharegpt.read,
    "servegen": servegen.read,
    "sharegpt-sessions": sharegpt_sessions.read,
}
_SEEDED = frozenset({"sharegpt", "servegen", "sharegpt-sessions"})

FORMATS: tuple[str, ...] = ("auto", *_READERS)
"""Values accepted by ``--format`` (``auto`` detects)."""


def read_trace_with_stats(
    path: str | Path,
    fmt: str = "auto",
    *,
    limit: int | None = None,
    seed: int = 0,
    **opts: Any,
) -> tuple[list[TraceRequest], ReadStats]:
    """Like :func:`read_trace`, also returning what was read, dropped and skipped."""
    p = Path(path)
    check_limit(limit)
    name = detect_format(p) if fmt == "auto" else fmt
    if name not in _READERS:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {FORMATS}")
    if name != "servegen" and not p.is_file():
        raise FileNotFoundError(f"no such trace file: {p}")
    stats = ReadStats(path=str(p), fmt=name)
    if name in _SEEDED:
        opts["seed"] = seed
    requests = _READERS[name](p, stats, limit=limit, **opts)
    if limit is not None:
        requests = sorted(requests, key=lambda r: r.arrival_s)[:limit]
    requests = rebase(requests)
    stats.kept = len(requests)
    return requests, stats


def read_trace(
    path: str | Path,
    fmt: str = "auto",
    *,
    limit: int | None = None,
    seed: int = 0,
    **opts: Any,
) -> list[TraceRequest]:
    """The requests of a trace, sorted by arrival, first arrival at 0, rids 0..n-1.

    ``limit`` keeps the first ``limit`` valid requests (in file order for files, by arrival for
    ServeGen). ``seed`` drives the formats that generate arrivals (``sharegpt``, ``servegen``).
    """
    requests, stats = read_trace_with_stats(path, fmt, limit=limit, seed=seed, **opts)
    if stats.dropped_zero_tokens:
        log.info("%s: dropped %d zero-token rows of %d", path, stats.dropped_zero_tokens, stats.rows)
    if stats.skipped_clients:
        log.info("%s: skipped clients without a dataset file: %s", path, stats.skipped_clients)
    return requests
