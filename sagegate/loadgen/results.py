"""Reading and writing run records (JSON lines, Parquet), so ``sagegate replay compare`` can set a
simulated run and a live one side by side. The record itself is :class:`core.record.RequestRecord`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from sagegate.core.record import RequestRecord, record_from_dict


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
