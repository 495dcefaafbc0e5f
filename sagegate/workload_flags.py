"""The workload options shared by ``simulate`` and ``replay``: both build their requests through
:func:`loadgen.schedule.prepare_workload`, so both runs see the same requests at the same times."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sagegate.loadgen.schedule import Workload


ClientCap = Annotated[
    int,
    typer.Option(
        "--max-tokens",
        help="max_tokens for requests whose trace records no cap (0: none); longer outputs are cut. "
        "Never the true length, which travels only in sim_output_tokens.",
    ),
]
"""The client cap, as ``replay`` sends it and ``simulate`` models it (default 4,096)."""


def parse_reader_opts(values: list[str] | None) -> dict[str, Any]:
    """``["start_s=3600", "clients=[1,2]"]`` as reader options; values are JSON when they parse."""
    out: dict[str, Any] = {}
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--reader-opt must look like 'name=value', got {raw!r}")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


@dataclass(frozen=True)
class WorkloadFlags:
    """The workload options, picked by name from a command's parameters so each command lists them
    only in its signature (typer needs them there, each with its own help text). ``requests`` is
    ``simulate``'s, ``sharegpt`` is ``replay``'s; left out, ``prepare_workload``'s defaults hold."""

    trace: str
    fmt: str
    limit: int | None
    duration: float | None
    rate_scale: float
    rate: float | None
    arrival: str
    cv: float
    warmup: float
    seed: int
    prompts: str
    reader_opt: list[str] | None
    requests: int | None = None
    sharegpt: Path | None = None
    max_tokens: int | None = None
    """The client cap (0: none); see ``loadgen.records.with_client_cap``."""

    @classmethod
    def pick(cls, params: Mapping[str, Any]) -> WorkloadFlags:
        """The options among ``params`` (a command's ``locals()``); other names are ignored."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})

    def load(self) -> Workload:
        """Read or generate the workload (raises ValueError, or FileNotFoundError for a missing trace)."""
        from sagegate.loadgen.schedule import prepare_workload

        opts = asdict(self)
        trace, fmt, reader_opt = opts.pop("trace"), opts.pop("fmt"), opts.pop("reader_opt")
        if opts["requests"] is None:
            del opts["requests"]
        opts["max_tokens"] = opts["max_tokens"] or None
        return prepare_workload(trace, fmt, reader_opts=parse_reader_opts(reader_opt), **opts)
