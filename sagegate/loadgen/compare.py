"""Two runs side by side: the same summary figures for each, and their ratio B/A.

Works on any two result files of the shared schema — live against live, live against simulated —
because both are summarised by the same :func:`core.summary.summarize`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sagegate.core.record import RequestRecord
from sagegate.core.summary import Slo, errors_by_kind, summarize
from sagegate.loadgen.results import read_results

HEADLINE = (
    "requests",
    "completed",
    "rejected",
    "errors",
    *(f"{m}_{s}" for m in ("ttft", "tpot", "itl", "ttlt") for s in ("mean_s", "p50_s", "p90_s", "p99_s")),
    "queue_p50_s",
    "queue_p99_s",
    "throughput_req_s",
    "throughput_tok_s",
    "slo_attainment",
    "goodput_req_s",
    "goodput_tok_s",
    "deadline_violation_rate",
    "preemptions",
    "makespan_s",
    "send_lateness_p50_s",
    "send_lateness_p99_s",
)
"""Rows shown, in this order, when either run has them."""


@dataclass(frozen=True, slots=True)
class Row:
    metric: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        """B/A; None when either side is missing or not a number, or A is zero."""
        if self.a is None or self.b is None or math.isnan(self.a) or math.isnan(self.b) or self.a == 0:
            return None
        return self.b / self.a


def compare_records(
    a: Sequence[RequestRecord], b: Sequence[RequestRecord], slo: Slo | None = None
) -> list[Row]:
    """Rows of :data:`HEADLINE` present in either summary, then error kinds, each ``(A, B, B/A)``."""
    sa, sb = summarize(a, slo), summarize(b, slo)
    rows = [Row(k, sa.get(k), sb.get(k)) for k in HEADLINE if k in sa or k in sb]
    ea, eb = errors_by_kind(a), errors_by_kind(b)
    for kind in sorted(set(ea) | set(eb)):
        rows.append(Row(f"errors[{kind}]", float(ea.get(kind, 0)), float(eb.get(kind, 0))))
    return rows


def compare_files(a: str | Path, b: str | Path, slo: Slo | None = None) -> list[Row]:
    """:func:`compare_records` on two JSON-lines or Parquet result files."""
    return compare_records(read_results(a), read_results(b), slo)


def _clean(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def rows_to_json(rows: Sequence[Row], a_name: str, b_name: str) -> dict[str, object]:
    """``{"a": name, "b": name, "metrics": {metric: {"a", "b", "ratio"}}}`` with NaN as null."""
    return {
        "a": a_name,
        "b": b_name,
        "metrics": {r.metric: {"a": _clean(r.a), "b": _clean(r.b), "ratio": r.ratio} for r in rows},
    }


def _fmt(metric: str, x: float | None) -> str:
    if x is None or math.isnan(x):
        return "—"
    if metric.endswith("_s") and not metric.startswith(("throughput", "goodput", "makespan")):
        return f"{x * 1000:,.1f} ms"
    if float(x).is_integer() and abs(x) >= 1:
        return f"{x:,.0f}"
    return f"{x:,.3f}"


def render_table(rows: Sequence[Row], a_name: str, b_name: str, title: str = "A vs B") -> None:
    """Print the side-by-side table (latencies in ms)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column(f"A: {a_name}", justify="right")
    table.add_column(f"B: {b_name}", justify="right")
    table.add_column("B/A", justify="right")
    for r in rows:
        ratio = r.ratio
        table.add_row(
            r.metric, _fmt(r.metric, r.a), _fmt(r.metric, r.b), "—" if ratio is None else f"{ratio:.3f}"
        )
    Console().print(table)
