"""The ``semantic`` predictor for sources with prompt text, precomputed outside the simulation loop.

Embedding prompts is far slower than simulating them, so each window's distributions are computed
once in the driver (batched) and handed to the cells as a ``PrecomputedPredictor``. The predictor
learns from the source's rows that lie in no window (at most ``history`` of them, those nearest the
end of the trace), so no request's own outcome is in its history. The predictor's synchronous core
(``features_many`` / ``record_features`` / ``predict_features``) is used directly, with a fixed clock,
so the answers do not depend on wall time or on request ids shared between windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
    rows: Sequence[TraceRequest],
    windows: Sequence[Window],
    *,
    history: int = 5000,
    embedder: Any = None,
) -> dict[str, Mapping[int, LengthDistribution]]:
    """Window id → (rid → predicted distribution); empty when the windows carry no prompt text.

    ``rows`` must be the valid, arrival-sorted rows the windows were cut from. ``embedder`` (a
    ``TextEmbedder``) defaults to the predictor's MiniLM model.
    """
    todo = [w for w in windows if w.has_text]
    if not todo:
        return {}
    try:
        from predictor.semantic import SemanticPredictor
    except ImportError as exc:  # pragma: no cover - depends on the optional predictor
        raise RuntimeError(f"the semantic predictor is not available: {exc}") from exc

    pred = SemanticPredictor(embedder=embedder, clock=lambda: 0.0)
    try:
        past = history_rows(rows, windows, history)
        feats = pred.features_many([r.prompt or "" for r in past])
        for i, (r, f) in enumerate(zip(past, feats, strict=True)):
            pred.record_features(
                f, r.prompt_tokens, r.output_tokens, tenant=r.tenant, rid=f"hist-{i}", ts=0.0
            )
        out: dict[str, Mapping[int, LengthDistribution]] = {}
        for w in todo:
            wf = pred.features_many([r.prompt or "" for r in w.requests])
            out[w.id] = {
                r.rid: pred.predict_features(f, r.prompt_tokens).distribution
                for r, f in zip(w.requests, wf, strict=True)
            }
        return out
    finally:
        pred.close()
