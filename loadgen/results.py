"""The per-request result schema shared by live replay and simulation, and its summary.

A simulated run and a live run write the same records, so ``sagegate replay compare`` can set them
side by side. Times are seconds from the start of the workload (a live replay's start; a request's
``arrival_s`` is its scheduled send time).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # tokens actually generated
    status: str = "ok"  # ok | rejected | error | cancelled
    reason: str = ""
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None  # the last token
    preemptions: int = 0
    backend: str = ""
    cached_tokens: int = 0
    predicted_mean: float | None = None
    tenant: str = "default"
    deadline_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # every token-bearing chunk (live replay)
    sent_s: float | None = None  # live: when the request actually left (arrival_s is when it should have)
    first_byte_s: float | None = None  # live: response headers received
    http_status: int | None = None
    error_kind: str = ""  # e.g. timeout, connect, http_500, incomplete (empty when ok)
    warmup: bool = False  # sent to warm the system, left out of the summary

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def ttlt(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def queue_s(self) -> float | None:
        return None if self.dispatch_s is None else self.dispatch_s - self.arrival_s

    @property
    def lateness(self) -> float | None:
        """How late the request left against its schedule (live replay only)."""
        return None if self.sent_s is None else self.sent_s - self.arrival_s

    def itls(self) -> list[float]:
        """Gaps between consecutive token chunks."""
        c = self.chunk_times
        return [b - a for a, b in itertools.pairwise(c)]


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives a request must all meet to count towards goodput (None = no objective)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    ttlt_s: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.ttlt_s is None

    def met(self, r: RequestRecord) -> bool:
        if r.status != "ok" or r.finish_s is None:
            return False
        checks = ((self.ttft_s, r.ttft), (self.tpot_s, r.tpot), (self.ttlt_s, r.ttlt))
        return all(limit is None or value is None or value <= limit for limit, value in checks)


def _stats(values: Sequence[float], prefix: str, quantiles: Iterable[int] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        out = {f"{prefix}_mean_s": math.nan}
        out.update({f"{prefix}_p{q}_s": math.nan for q in quantiles})
        return out
    arr = np.asarray(values, dtype=float)
    out = {f"{prefix}_mean_s": float(arr.mean())}
    for q in quantiles:
        out[f"{prefix}_p{q}_s"] = float(np.percentile(arr, q))
    return out


def measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records that count: warm-up requests left out."""
    return [r for r in records if not r.warmup]


def mark_warmup(records: Iterable[RequestRecord], warmup_s: float) -> None:
    """Flag the requests that arrived in the first ``warmup_s`` seconds."""
    for r in records:
        r.warmup = r.arrival_s < warmup_s


def summarize(records: Sequence[RequestRecord], slo: Slo | None = None) -> dict[str, float]:
    """Headline figures over the measured (non-warm-up) records: counts, TTFT/TPOT/TTLT mean and
    percentiles, ITL when chunk times were recorded, throughput, preemptions, goodput under ``slo``,
    and the replay client's own send lateness when send times were recorded."""
    records = measured(records)
    done = [r for r in records if r.status == "ok" and r.finish_s is not None]
    out: dict[str, float] = {
        "requests": float(len(records)),
        "completed": float(len(done)),
        "rejected": float(sum(r.status == "rejected" for r in records)),
        "errors": float(sum(r.status == "error" for r in records)),
    }
    out.update(_stats([r.ttft for r in done if r.ttft is not None], "ttft"))
    out.update(_stats([r.tpot for r in done if r.tpot is not None], "tpot"))
    if any(r.chunk_times for r in done):
        out.update(_stats([g for r in done for g in r.itls()], "itl"))
    out.update(_stats([r.ttlt for r in done if r.ttlt is not None], "ttlt"))
    out.update(_stats([r.queue_s for r in done if r.queue_s is not None], "queue", (50, 99)))
    span = 0.0
    if done:
        start = min(r.arrival_s for r in records)
        end = max(r.finish_s for r in done if r.finish_s is not None)
        span = max(end - start, 1e-9)
        tokens = sum(r.output_tokens for r in done)
        out["throughput_tok_s"] = tokens / span
        out["throughput_req_s"] = len(done) / span
        out["makespan_s"] = span
    else:
        out["throughput_tok_s"] = out["throughput_req_s"] = out["makespan_s"] = 0.0
    if slo is not None and not slo.empty:
        good = [r for r in done if slo.met(r)]
        out["slo_attainment"] = len(good) / len(records) if records else math.nan
        out["goodput_req_s"] = len(good) / span if span else 0.0
        out["goodput_tok_s"] = sum(r.output_tokens for r in good) / span if span else 0.0
    out["preemptions"] = float(sum(r.preemptions for r in records))
    with_deadline = [r for r in records if r.deadline_s is not None]
    if with_deadline:
        late = sum(1 for r in with_deadline if r.finish_s is None or r.finish_s > (r.deadline_s or 0.0))
        out["deadline_violation_rate"] = late / len(with_deadline)
    lateness = [r.lateness for r in records if r.lateness is not None]
    if lateness:
        arr = np.asarray(lateness, dtype=float)
        out["send_lateness_p50_s"] = float(np.percentile(arr, 50))
        out["send_lateness_p99_s"] = float(np.percentile(arr, 99))
        out["send_lateness_max_s"] = float(arr.max())
    return out


def errors_by_kind(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed and rejected measured requests by kind: ``error_kind``, else ``reason``, else status."""
    kinds = Counter(
        r.error_kind or r.reason or r.status for r in measured(records) if r.status not in ("ok",)
    )
    return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


_FIELDS = frozenset(f.name for f in fields(RequestRecord))


def record_from_dict(obj: dict[str, object]) -> RequestRecord:
    """A record from its dict form; keys this version does not know are ignored, missing ones default."""
    return RequestRecord(**{k: v for k, v in obj.items() if k in _FIELDS})  # type: ignore[arg-type]


def write_jsonl(records: Iterable[RequestRecord], path: str | Path) -> None:
    with Path(path).open("w") as fh:
        for r in records:
            fh.write(json.dumps(asdict(r)) + "\n")


def read_jsonl(path: str | Path) -> list[RequestRecord]:
    out = []
    with Path(path).open() as fh:
        for line in fh:
            if line.strip():
                out.append(record_from_dict(json.loads(line)))
    return out


def write_results(records: Sequence[RequestRecord], path: str | Path) -> Path:
    """Records as Parquet when ``path`` ends in ``.parquet`` (needs pyarrow), else as JSON lines."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([asdict(r) for r in records], schema=_arrow_schema())
        pq.write_table(table, p)
    else:
        write_jsonl(records, p)
    return p


def read_results(path: str | Path) -> list[RequestRecord]:
    """Records from a JSON-lines or Parquet file (Parquet recognised by its magic bytes)."""
    p = Path(path)
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PAR1":
        import pyarrow.parquet as pq

        return [record_from_dict(row) for row in pq.read_table(p).to_pylist()]
    return read_jsonl(p)


def _arrow_schema() -> Any:
    import pyarrow as pa

    kinds = {
        "int": pa.int64(),
        "float": pa.float64(),
        "str": pa.string(),
        "bool": pa.bool_(),
        "float | None": pa.float64(),
        "int | None": pa.int64(),
        "list[float]": pa.list_(pa.float64()),
    }
    return pa.schema([(f.name, kinds[str(f.type)]) for f in fields(RequestRecord)])
