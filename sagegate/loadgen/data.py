"""Where the public data lives, and which copy of a file to read.

Three places, looked up in this order by ``find_data``:

- **shared**: ``$SAGEGATE_DATA``, else ``<repo>/../shared/data`` (the full sets, for development and CI;
  see that folder's README). Never copied into the repository.
- **fetched**: what ``sagegate data fetch NAME`` downloaded, under ``$SAGEGATE_FETCH_DIR``, else
  ``$XDG_CACHE_HOME/sagegate/data`` (``~/.cache/sagegate/data``), laid out like the shared folder.
- **shipped**: the small real slices installed with the package (``loadgen/shipped/``, licences and
  the drawing rule in its ``DATA.md``), so a fresh install runs the main job on real data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[2]
SHIPPED_ROOT = Path(__file__).resolve().with_name("shipped")

AZURE_CONV = ("azure2023", "AzureLLMInferenceTrace_conv.csv")
AZURE_CODE = ("azure2023", "AzureLLMInferenceTrace_code.csv")
SHAREGPT = ("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
SHAREGPT_SESSIONS = ("sharegpt", "sharegpt_v3_multiturn.jsonl.gz")
MOONCAKE = ("mooncake", "synthetic_trace.jsonl")
BAILIAN_M_SMALL = ("servegen", "language", "m-small")
BAILIAN_DEEPSEEK_R1 = ("servegen", "reason", "deepseek-r1")

SHIPPED: dict[tuple[str, ...], tuple[str, ...]] = {
    AZURE_CONV: ("azure2023", "AzureLLMInferenceTrace_conv.csv.gz"),
    AZURE_CODE: ("azure2023", "AzureLLMInferenceTrace_code.csv.gz"),
    SHAREGPT: ("sharegpt", "sharegpt_v3_first_turn_pairs_4000.jsonl.gz"),
    SHAREGPT_SESSIONS: ("sharegpt", "sharegpt_v3_multiturn_600.jsonl.gz"),
}
"""Shared-layout parts -> the shipped copy's parts under ``SHIPPED_ROOT``."""

_SHIPPED_NOTES: dict[tuple[str, ...], str] = {
    AZURE_CONV: "the full trace, gzipped",
    AZURE_CODE: "the full trace, gzipped",
    SHAREGPT: "a seeded 4,000-pair subset; response text dropped, its token count kept",
    SHAREGPT_SESSIONS: "a seeded 600-conversation subset, full text, none a shipped predictor learned from",
}

Origin = Literal["shared", "fetched", "shipped"]


@dataclass(frozen=True, slots=True)
class DataFile:
    """A file found by ``find_data``: where it is, which of the three places, and what it holds."""

    path: Path
    origin: Origin
    note: str = ""

    def describe(self) -> str:
        """One line for a command to print, e.g. ``shipped copy .../x.csv.gz (the full trace, gzipped)``."""
        return f"{self.origin} copy {self.path}" + (f" ({self.note})" if self.note else "")


def data_root() -> Path:
    env = os.environ.get("SAGEGATE_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def data_file(*parts: str) -> Path:
    """The path of ``parts`` under the shared data root (it may not exist: callers check)."""
    return data_root().joinpath(*parts)


def fetch_root() -> Path:
    """Where ``sagegate data fetch`` puts files: never inside the repository."""
    env = os.environ.get("SAGEGATE_FETCH_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "sagegate" / "data"


def shipped_file(*parts: str) -> Path | None:
    """The shipped copy of the shared-layout ``parts``, or None when none ships."""
    rel = SHIPPED.get(tuple(parts))
    return SHIPPED_ROOT.joinpath(*rel) if rel is not None else None


def find_data(*parts: str) -> DataFile | None:
    """The shared file if present, else a fetched one, else the shipped copy if one ships, else None.

    ``parts`` are in the shared folder's layout (e.g. ``*AZURE_CONV``); the result says which copy it
    is, so a caller can print ``found.describe()`` and a reader of its output knows what it ran on.
    """
    shared = data_file(*parts)
    if shared.exists():
        return DataFile(shared, "shared")
    fetched = fetch_root().joinpath(*parts)
    if fetched.exists():
        return DataFile(fetched, "fetched")
    shipped = shipped_file(*parts)
    if shipped is not None and shipped.exists():
        return DataFile(shipped, "shipped", _SHIPPED_NOTES.get(tuple(parts), ""))
    return None
