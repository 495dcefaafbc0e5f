"""A model of vllm-router's ``cache_aware`` policy (0.1.17, its defaults) for the simulator's engine
level (``SimSetup.route``), so that the gateway and the router it is measured against can be compared
on the same draws in seconds, and each request's cache hit traced (``bench_router_gap``).

What the router does, as its ``--help`` states it: while the loads (requests it has in flight on each
worker) are balanced, a prompt goes to the worker whose tree matches the largest share of it if that
share exceeds ``cache_threshold``, else to the worker whose tree holds the fewest characters; when
``max − min > balance_abs_threshold`` and ``max > min × balance_rel_threshold``, to the least loaded.
A prompt enters the chosen worker's tree when it is routed. Modelled: the tree as the prompt's
leading chunks of ``CHUNK`` characters (a match is whole chunks), the load as the engine's running and
waiting requests, and no eviction from the tree (its 32 M-character budget is never reached here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sagegate.core.request import TraceRequest
from sagegate.sim.engine import Engine

CHUNK = 64
"""Characters per tree step: a prompt's match is counted in whole chunks."""


@dataclass
class CacheAwareRouter:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    trees: list[set[int]] = field(default_factory=list)
    """Each worker's tree: the digests of the prompt prefixes routed there, chunk by chunk."""
    sizes: list[int] = field(default_factory=list)
    """Characters each worker's tree holds."""

    def __call__(self, req: TraceRequest, engines: Sequence[Engine]) -> int:
        if not self.trees:
            self.trees = [set() for _ in engines]
            self.sizes = [0] * len(engines)
        text = req.prompt or ""
        chain = _chain(text)
        loads = [e.num_running + e.num_waiting for e in engines]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            idx = loads.index(lo)
        else:
            matched = [_matched(chain, tree) for tree in self.trees]
            best = max(range(len(engines)), key=lambda i: matched[i])
            share = matched[best] * CHUNK / max(1, len(text))
            idx = best if share > self.cache_threshold else self.sizes.index(min(self.sizes))
        new = [h for h in chain if h not in self.trees[idx]]
        self.trees[idx].update(new)
        self.sizes[idx] += len(new) * CHUNK
        return idx


def _chain(text: str) -> list[int]:
    """A digest per whole leading chunk, each of all the text up to its end."""
    out, h = [], 0
    for k in range(0, len(text) - CHUNK + 1, CHUNK):
        h = hash((h, text[k : k + CHUNK]))
        out.append(h)
    return out


def _matched(chain: list[int], tree: set[int]) -> int:
    """Leading chunks of ``chain`` in ``tree``."""
    n = 0
    for h in chain:
        if h not in tree:
            break
        n += 1
    return n
