"""Gateway-level pause: when a running request should yield its backend to better-ranked waiting work.

The engine's preemption that pays (:mod:`policies.preemption`) lives inside one engine. At the gateway
a dispatched request can be *paused* instead: its upstream stream is cancelled (the backend frees its
KV at once), and it waits in the gateway's queue again as a continuation (prompt plus what it
generated, the rest of its output to come) to be resumed on any backend, where the prefix cache may
still hold what it computed. The dispatch loop (:mod:`policies.dispatch_loop`) asks
:func:`choose_pause` when its head fits nowhere; both drivers (the live gateway and the simulator)
therefore decide alike.

A pause is chosen only when all of these hold, for a victim that has started on a backend:

* the policy prices displacements (``PREEMPT_PAYS``: it states ``expected_remaining``, a
  :class:`~policies.interfaces.Displacement`) and ranks
  the victim strictly behind the head (its key, recomputed at its rank boundaries, is larger);
* the policy allows it (``may_preempt``: a resumed request is held until its next rank boundary) and
  it has been paused fewer than ``max_pauses`` times;
* without the victim's charge the head fits that backend (the pause makes the room it waits for);
* the expected gain beats the resume cost by ``hysteresis``: the gain is what the exchange buys the
  pair (:func:`policies.preemption.pair_gain_s`, in decode steps), the cost the prefill of the
  victim's prompt and generated tokens less the prefix its backend is expected still to cache,
  slowing every request running there.

Of the candidates the one with the widest margin is paused (the first dispatched on a tie).

Priority bands (``bands``, on by default, whether or not pausing by rank is): a head that fits
nowhere pauses a running request of a strictly *lower* band (``SchedRequest.priority``) without which
it fits, the lowest band first and of those the one holding least (cheapest to resume): a band is a
promise about order, not a bet on mean latency, so no gain is priced. With every request in one band
(the default) it never happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, Holdings
from sagegate.policies.base import SchedRequest
from sagegate.policies.interfaces import Displacement
from sagegate.policies.preemption import pair_gain_s

R = TypeVar("R", bound=SchedRequest)


@dataclass(frozen=True, slots=True)
class PauseConfig:
    """Gateway pause/resume (``gateway.settings`` ``pause``); off by default (RESULTS.md, *Pausing and
    engine-level preemption*)."""

    enabled: bool = False
    max_pauses: int = 1
    """A request is paused at most this many times (then it runs to the end)."""
    hysteresis: float = 2.0
    """The expected gain must exceed this multiple of the resume cost (chosen a priori, not tuned)."""
    prefill_tokens_per_step: float = 512.0
    """Prefill tokens one decode step of engine time buys: the resume cost's exchange rate. Between
    ~250 and ~1000 for Llama-3.1-8B on an H100 by the simulator's roofline (``sim.perf``), by batch."""
    bands: bool = True
    """A higher priority band's head that fits nowhere pauses a lower band's running request (module
    docstring), ``enabled`` or not."""

    def __post_init__(self) -> None:
        if self.max_pauses < 0:
            raise ValueError("pause max_pauses must be >= 0")
        if self.hysteresis < 0:
            raise ValueError("pause hysteresis must be >= 0")
        if self.prefill_tokens_per_step <= 0:
            raise ValueError("pause prefill_tokens_per_step must be positive")


@dataclass(frozen=True, slots=True)
class PauseChoice:
    """A pause the rule chose: ``victim`` leaves ``backend`` so that the head fits there."""

    victim: SchedRequest
    backend: int
    gain_steps: float
    cost_steps: float


def fits_without(load: BackendLoad, gone: Charge, head: Charge, cfg: AdmissionConfig, prompt: int) -> bool:
    """Would ``load`` admit ``head`` (waiting bounds included) once ``gone`` has left? Reads only."""
    if not load.healthy or load.waiting >= cfg.max_waiting:
        return False
    if load.waiting and load.waiting_tokens + prompt > cfg.max_waiting_tokens:
        return False
    charged = load.charged_tokens - gone.value
    others = [c for c in load.holdings if c is not gone]
    if not others:
        return True  # an idle backend always admits
    if cfg.rule == "sum":
        return cfg.target * load.capacity_tokens - charged >= head.value
    limit = cfg.peak_target * load.capacity_tokens
    if charged + head.value <= limit:
        return True
    rest = Holdings()
    for c in others:
        rest.add(c)
    return rest.fits(head, limit)


def resume_cost_steps(
    load: BackendLoad, victim: Charge, head: Charge, running: int, cfg: PauseConfig
) -> float:
    """Engine time the victim's resume prefill costs, in decode steps summed over the ``running``
    requests it slows. The victim's blocks stay cached when it leaves; the head takes the free room
    first and then evicts the victim's tail, so the victim finds again what the head leaves."""
    held_by_others = sum(c.held for c in load.holdings if c is not victim)
    free_after = max(0, load.capacity_tokens - held_by_others - victim.held)
    evicted = max(0, head.held - free_after)
    known = victim.held
    cached = min(max(0, known - evicted), known - 1)
    return (known - cached) / cfg.prefill_tokens_per_step * max(1, running)


def choose_pause(
    policy: Displacement,
    head: R,
    head_charge: Charge,
    head_key: object,
    loads: Sequence[BackendLoad],
    running: Sequence[Sequence[tuple[R, Charge]]],
    allowed: Sequence[bool] | None,
    admission: AdmissionConfig,
    cfg: PauseConfig,
    now: float,
) -> PauseChoice | None:
    """The pause that pays most for ``head`` (which fits nowhere now), or None (module docstring).
    ``running[i]`` is what has started on backend ``i``, in dispatch order, with its charges."""
    if cfg.bands:
        lower = _band_pause(head, head_charge, loads, running, allowed, admission, cfg)
        if lower is not None:
            return lower
    if not cfg.enabled:
        return None
    best: PauseChoice | None = None
    margin = 0.0
    head_left = policy.expected_remaining(head)
    for i, started in enumerate(running):
        if not started or (allowed is not None and not allowed[i]):
            continue
        load = loads[i]
        left = [policy.expected_remaining(r) for r, _ in started]
        order = sorted(left)
        for (victim, charge), v in zip(started, left, strict=True):
            if victim.pauses >= cfg.max_pauses or not head_key < policy.key(victim, now):
                continue
            if not policy.may_preempt(victim, now):
                continue
            # the first departure other than the victim's
            room = (order[1] if len(order) > 1 else float("inf")) if v == order[0] else order[0]
            gain = pair_gain_s(v, head_left, room, 1.0)
            if gain <= margin:
                continue
            cost = resume_cost_steps(load, charge, head_charge, len(started), cfg)
            if gain <= cfg.hysteresis * cost or gain - cost <= margin:
                continue
            if not fits_without(load, charge, head_charge, admission, head.prompt_tokens):
                continue
            best, margin = PauseChoice(victim, i, gain, cost), gain - cost
    return best


def _band_pause(
    head: R,
    head_charge: Charge,
    loads: Sequence[BackendLoad],
    running: Sequence[Sequence[tuple[R, Charge]]],
    allowed: Sequence[bool] | None,
    admission: AdmissionConfig,
    cfg: PauseConfig,
) -> PauseChoice | None:
    """The lowest-band, least-holding running request of a band below ``head``'s without which
    ``head`` fits, or None."""
    best: PauseChoice | None = None
    best_key: tuple[int, float] | None = None
    for i, started in enumerate(running):
        if not started or (allowed is not None and not allowed[i]):
            continue
        for victim, charge in started:
            if victim.priority >= head.priority or victim.pauses >= cfg.max_pauses:
                continue
            ceiling = victim.band_ceiling
            if ceiling is not None and head.priority <= ceiling and victim.tenant != head.tenant:
                continue  # another tenant may pause it only from a band its own tenant cannot claim
            key = (victim.priority, float(charge.held))
            if best_key is not None and key >= best_key:
                continue
            if fits_without(loads[i], charge, head_charge, admission, head.prompt_tokens):
                best, best_key = PauseChoice(victim, i, 0.0, 0.0), key
    return best
