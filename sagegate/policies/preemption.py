"""Preemption that pays for itself: the engine prices a preemption, the policy values it.

A preemption by recompute throws away the victim's KV; what the prefix cache still holds when it is
admitted again is found, the rest is computed again, and that prefill slows every request in the
batch while it runs. The engine states that price as a :class:`PreemptionCost`; a ``PREEMPT_PAYS``
policy states what it expects each request still to generate
(:meth:`~policies.interfaces.Displacement.expected_remaining`), from which :func:`pair_gain_s` values the
displacement (seconds of latency saved over the pair); it happens only when :func:`pays`. Both sides
are in engine seconds summed over requests, so neither needs the other's model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What displacing one running request would cost, as the engine estimates it at that instant."""

    known_tokens: int
    """Prompt plus generated tokens of the victim: what its KV must hold again before it resumes."""
    cached_tokens: int
    """Of those, the prefix the cache is expected to still hold when it resumes (not recomputed)."""
    recompute_s: float
    """Engine time of the recompute prefill."""
    delayed: int
    """Requests whose steps that prefill slows (the running batch, the victim included)."""

    @property
    def recompute_tokens(self) -> int:
        return max(1, self.known_tokens - self.cached_tokens)

    @property
    def delay_s(self) -> float:
        """Latency the preemption adds, summed over the requests it slows."""
        return self.recompute_s * self.delayed


def pays(gain_s: float, cost: PreemptionCost) -> bool:
    """Preempt only when the expected gain exceeds the cost (a tie keeps the victim running)."""
    return gain_s > cost.delay_s


def pair_gain_s(victim_left: float, waiting_left: float, room_steps: float, step_s: float) -> float:
    """What displacing the victim buys the pair, in engine seconds summed over both.

    Without the preemption the waiting request starts when room frees anyway: after the victim's
    ``victim_left`` steps or the first other departure, ``room_steps`` (whichever comes first); with
    it, the waiting request starts now and the victim restarts after ``waiting_left`` steps or that
    same departure. The gain is the difference, ``min(V, W) − min(B, W)`` steps; on one slot
    (``room_steps`` infinite) it is the plain exchange argument ``V − B``. The recompute is the cost,
    priced apart (:class:`PreemptionCost`)."""
    return max(0.0, min(victim_left, room_steps) - min(waiting_left, room_steps)) * step_s
