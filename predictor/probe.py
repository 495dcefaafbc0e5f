"""An optional linear probe: ridge regression of log output length on a prompt's TF-IDF terms, refitted
off the request path over the live window.

It is a (tiny, closed-form) trained model, so it is off by default: the product's predictor stays
"similar past prompts, no training". Turned on (``SemanticConfig.probe_weight``), it moves the
neighbours' distribution in log space toward the probe's estimate; on ShareGPT that adds about 0.01 to
Kendall's tau. A fit is a sparse least-squares solve (LSQR) over the window, seconds at 100k entries.
"""

from __future__ import annotations

import numpy as np

from predictor.lexical import HASH_BITS


class LengthProbe:
    def __init__(self, alpha: float = 3.0, iterations: int = 200) -> None:
        self.alpha = alpha
        self.iterations = iterations
        self.coef: np.ndarray | None = None
        self.intercept = 0.0
        self.fitted_on = 0

    def fit(self, docs: list[tuple[np.ndarray, np.ndarray]], lengths: np.ndarray) -> LengthProbe:
        """``docs``: (term ids, weights) per row; ``lengths``: their output lengths."""
        from scipy import sparse
        from scipy.sparse.linalg import lsqr

        if not docs:
            return self
        y = np.log(np.maximum(lengths.astype(np.float64), 1.0))
        indptr = np.cumsum([0] + [t.size for t, _ in docs])
        indices = np.concatenate([t for t, _ in docs]).astype(np.int64)
        data = np.concatenate([w for _, w in docs]).astype(np.float64)
        x = sparse.csr_matrix((data, indices, indptr), shape=(len(docs), 1 << HASH_BITS))
        mean = float(y.mean())
        coef = lsqr(x, y - mean, damp=float(np.sqrt(self.alpha)), iter_lim=self.iterations)[0]
        self.coef, self.intercept, self.fitted_on = coef.astype(np.float32), mean, len(docs)
        return self

    def predict(self, terms: np.ndarray, weights: np.ndarray) -> float | None:
        """Estimated log length, or None before the first fit."""
        if self.coef is None:
            return None
        return self.intercept + float(self.coef[terms] @ weights) if terms.size else self.intercept
