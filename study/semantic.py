"""The ``semantic`` predictor for sources with prompt text, precomputed outside the simulation loop.

Embedding prompts is far slower than simulating them, so each window's distributions are computed
once in the driver and handed to the cells as a ``PrecomputedPredictor``. The predictor learns from
the source's rows that lie in no window (nearest the windows first, at most ``history`` of them), so
no request's own outcome is in its history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from loadgen.records import TraceRequest
from study.windows import Window

if TYPE_CHECKING:
    from predictor.distribution import LengthDistribution


def history_rows(rows: Sequence[TraceRequest], windows: Sequence[Window], history: int) -> list[TraceRequest]:
    """Valid rows with text outside every window, at most ``history`` of them, in trace order."""
    inside: set[int] = set()
    for w in windows:
        inside.update(range(w.start_row, w.start_row + len(w.requests)))
    free = [r for i, r in enumerate(rows) if i not in inside and r.prompt]
    return free[-history:] if history and len(free) > history else free


def semantic_distributions(
    rows: Sequence[TraceRequest], windows: Sequence[Window], seed: int, history: int = 5000
) -> dict[str, Mapping[int, LengthDistribution]]:
    """Window id → (rid → predicted distribution); empty when the windows carry no prompt text.

    ``rows`` must be the same valid, arrival-sorted rows the windows were cut from.
    """
    todo = [w for w in windows if w.has_text]
    if not todo:
        return {}
    try:
        import predictor.semantic  # noqa: F401  (registers "semantic" with make_predictor)
    except ImportError as exc:  # pragma: no cover - depends on the optional predictor
        raise RuntimeError(f"the semantic predictor is not available: {exc}") from exc
    from predictor.baselines import make_predictor

    pred = make_predictor("semantic", seed=seed)
    for r in history_rows(rows, windows, history):
        pred.observe(r, r.output_tokens)
    return {w.id: {r.rid: pred.predict(r) for r in w.requests} for w in todo}
