"""The service-cost model SageSched ranks by (docs/design/policies.md, the SageSched section).

Generating token ``t`` of ``O`` keeps about ``I + t`` tokens of KV for one step, so a request's
KV-memory × time is ``C(O) = I·O + O²/2``; the cost attained after ``o`` tokens is ``C(o)``.
Pure arithmetic: the scheduler calls these in its hot path.
"""

from __future__ import annotations

from sagegate.core.distribution import LengthDistribution


def service_cost(prompt_tokens: int | float, output_tokens: int | float) -> float:
    """``C(O) = I·O + O²/2``: KV tokens held, summed over the decode steps."""
    o = float(output_tokens)
    return float(prompt_tokens) * o + 0.5 * o * o


def length_cost(output_tokens: int | float) -> float:
    """Cost = output length alone (the ``gittins-length`` ablation: no memory-time weighting)."""
    return float(output_tokens)


def cost_support(dist: LengthDistribution, prompt_tokens: int | float) -> tuple[float, ...]:
    """The distribution's support mapped to costs ``c_k = C(o_k)`` (ascending, as the support is)."""
    i = float(prompt_tokens)
    return tuple(i * o + 0.5 * o * o for o in map(float, dist.support))


def length_support(dist: LengthDistribution) -> tuple[float, ...]:
    """The support as costs under :func:`length_cost`."""
    return tuple(float(o) for o in dist.support)
