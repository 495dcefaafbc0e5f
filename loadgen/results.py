"""The per-request result schema shared by live replay and simulation, and its summary.

A simulated run and a live run write the same records, so ``sagegate replay compare`` can set them
side by side. Times are seconds from the start of the workload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    finish_s: float | None = None
    preemptions: int = 0
    backend: str = ""
    cached_tokens: int = 0
    predicted_mean: float | None = None
    tenant: str = "default"
    deadline_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)

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


def summarize(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Headline figures: counts, TTFT/TPOT/TTLT mean and percentiles, throughput, preemptions."""
    done = [r for r in records if r.status == "ok" and r.finish_s is not None]
    out: dict[str, float] = {
        "requests": float(len(records)),
        "completed": float(len(done)),
        "rejected": float(sum(r.status == "rejected" for r in records)),
        "errors": float(sum(r.status == "error" for r in records)),
    }
    out.update(_stats([r.ttft for r in done if r.ttft is not None], "ttft"))
    out.update(_stats([r.tpot for r in done if r.tpot is not None], "tpot"))
    out.update(_stats([r.ttlt for r in done if r.ttlt is not None], "ttlt"))
    out.update(_stats([r.queue_s for r in done if r.queue_s is not None], "queue", (50, 99)))
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
    out["preemptions"] = float(sum(r.preemptions for r in records))
    with_deadline = [r for r in records if r.deadline_s is not None]
    if with_deadline:
        late = sum(1 for r in with_deadline if r.finish_s is None or r.finish_s > (r.deadline_s or 0.0))
        out["deadline_violation_rate"] = late / len(with_deadline)
    return out


def write_jsonl(records: Iterable[RequestRecord], path: str | Path) -> None:
    with Path(path).open("w") as fh:
        for r in records:
            fh.write(json.dumps(asdict(r)) + "\n")


def read_jsonl(path: str | Path) -> list[RequestRecord]:
    out = []
    with Path(path).open() as fh:
        for line in fh:
            if line.strip():
                out.append(RequestRecord(**json.loads(line)))
    return out
