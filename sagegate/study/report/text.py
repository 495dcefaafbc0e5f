"""How the report writes numbers, lists and tables, and ranks a panel: shared by every section."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def fmt(x: float | None, nd: int = 3) -> str:
    """``x`` to ``nd`` decimals; an undefined value as a dash."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{nd}f}"


def pct(x: float | None, nd: int = 1) -> str:
    """``x`` as a percentage to ``nd`` decimals; an undefined value as a dash."""
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:.{nd}f}%"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines, followed by a blank line."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return [*out, ""]


def join_words(items: Sequence[str], empty: str = "none") -> str:
    """``a``, ``a and b``, ``a, b and c``; ``empty`` for no items."""
    items = list(items)
    if not items:
        return empty
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def competition_ranks(means: Mapping[str, float], higher_is_better: bool) -> dict[str, float]:
    """1 + the number of strictly better entries (ties share a rank); undefined values are left out."""
    vals = {k: v for k, v in means.items() if math.isfinite(v)}
    sign = 1.0 if higher_is_better else -1.0
    return {k: 1.0 + sum(sign * w > sign * v for w in vals.values()) for k, v in vals.items()}
