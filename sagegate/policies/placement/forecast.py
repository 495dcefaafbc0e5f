"""The ``forecast`` picker, the default: the backend where the request finishes soonest, counting
what it costs the requests already there (docs/placement.md).

For each backend the filters keep (its cached prompt counted), in seconds of an engine of one speed
(:class:`~sagegate.policies.engine_speed.EngineSpeed`):

* the request's own time to its last token: the prefill queued ahead of it (``queued_prefill``), its
  own uncached tokens (prompt less what the prefix index predicts cached there), and its predicted
  mean output at the batch it joins (the requests running and waiting there, itself included);
* what it costs the others there (``delay_others``): its prefill lengthens the steps of each of
  them, and its place in the batch slows each running one's. At full load this is what recomputing a
  shared prefix elsewhere really costs, and what keeps a follower with its prefix (vllm-router's
  balance rule encodes about the same);
* a backend that cannot take it now (memory, waiting bound) is weighed with the wait for it too
  (``wait``); if it still forecasts soonest the request waits for it (the picker answers None).

The lowest forecast wins; on a tie (idle backends, nothing cached) the most room, then the emptiest
cache, the first after that. Every term is linear in the speed, so only the ratios
of its three numbers change a choice. Pure and O(backends) but for the wait, which sorts one
backend's requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sagegate.policies.admission import BackendLoad
from sagegate.policies.engine_speed import EngineSpeed
from sagegate.policies.placement.outcome import Forecasted
from sagegate.policies.placement.plugins import Candidates
from sagegate.policies.placement.scorers.least_held import LeastHeld
from sagegate.policies.placement.scorers.room import Room

_ROOM, _LEAST_HELD = Room(), LeastHeld()


@dataclass(frozen=True)
class Forecast:
    """The backend where the request's last token is forecast soonest (module docstring)."""

    reads_scores: ClassVar[bool] = False
    """It weighs no scorers: a profile naming some with it is refused (``build_profile``)."""

    speed: EngineSpeed = field(default_factory=EngineSpeed)
    """The engines' speed where a backend's own is not known (``BackendLoad.speed``: the gateway
    learns each backend's from its counters, ``policies.engine_speed.SpeedFit``)."""
    learned: bool = False
    """Read a backend's speed as learned from its counters where it has one. Off: the linear fit
    reads a prefill token at a quarter of its time alone (prefills share steps with decodes), which
    makes recomputing a prefix look cheap; live on shared system prompts it cost 13% of TTLT against
    the assumed speed (RESULTS.md, *Placement by forecast*)."""
    wait: bool = True
    """Weigh a backend that cannot take the request now (its memory or its waiting bound) by the
    forecast plus the wait for it; if it still forecasts soonest, the request waits for it (the
    picker answers None: the head waits) rather than going where it would finish later."""
    delay_others: bool = True
    """Count what the request costs the requests already on the backend: its prefill delays each of
    them by its length (a step that prefills is a longer step), and its place in the batch slows each
    running one's steps. At full load this is what recomputing a shared prefix really costs."""

    def forecast(self, c: Candidates, i: int) -> float:
        """Seconds: the request's own time to its last token on backend ``i``, plus the time its
        prefill and its place in the batch add to the requests already there (``delay_others``)."""
        load, speed, prefill, out, there = self._terms(c, i)
        own = load.queued_prefill * speed.prefill_s + prefill + speed.decode_s(out, there + 1)
        if not self.delay_others:
            return own
        others = prefill * there + out * speed.per_seq_s * load.running
        return own + others

    def times(self, c: Candidates, i: int) -> Forecasted:
        """The request's own first and last token on backend ``i``, in seconds after it is sent there
        (the forecast less what it costs the others): what the gateway reports beside the outcome."""
        load, speed, prefill, out, there = self._terms(c, i)
        first = load.queued_prefill * speed.prefill_s + prefill + speed.decode_s(1.0, there + 1)
        return Forecasted(first, first + speed.decode_s(max(0.0, out - 1.0), there + 1))

    def _terms(self, c: Candidates, i: int) -> tuple[BackendLoad, EngineSpeed, float, float, int]:
        """Backend ``i``'s load and speed, the request's own uncached prefill there (seconds), its
        predicted mean output, and the requests running and waiting there."""
        q = c.query
        load = q.loads[i]
        speed = self.speed_of(load)
        cached = q.hits[i] if q.hits is not None else 0
        prefill = max(0, q.prompt_tokens - cached) * speed.prefill_s
        there = load.running + load.waiting + load.foreign_waiting
        return load, speed, prefill, _predicted_output(q.request), there

    def speed_of(self, load: BackendLoad) -> EngineSpeed:
        return load.speed if self.learned and load.speed is not None else self.speed

    def pick(self, c: Candidates) -> int | None:
        q = c.query
        hits = q.hits
        best: int | None = None
        best_key = (float("inf"), 0.0, 0.0)
        best_now = False
        for i in range(len(q.loads)):
            load = q.loads[i]
            cached = hits[i] if hits is not None else 0
            if c.kept(i, cached if cached > 0 else None):
                t, now = self.forecast(c, i), True
            elif self.wait and load.healthy and (q.allowed is None or q.allowed[i]):
                t, now = self.forecast(c, i) + self.wait_s(c, i, cached), False
            else:
                continue
            if t > best_key[0]:
                continue
            # a tie (idle backends, nothing cached): the most room, then the emptiest cache, so that
            # distinct prefixes spread instead of evicting each other on the first backend
            key = (t, -_ROOM.score(q, i), -_LEAST_HELD.score(q, i))
            if key < best_key:
                best, best_key, best_now = i, key, now
        return best if best_now else None

    def wait_s(self, c: Candidates, i: int, cached: int) -> float:
        """Seconds until backend ``i`` takes the request: its backlog over the waiting bound drained,
        and enough of its running requests (the predicted shortest first) gone for the charge to fit."""
        q = c.query
        load, cfg = q.loads[i], q.cfg
        speed = self.speed_of(load)
        backlog = load.queued_prefill + q.prompt_tokens - cached
        wait = max(0.0, backlog - cfg.max_waiting_tokens) * speed.prefill_s
        share = cfg.target if cfg.rule == "sum" else cfg.peak_target
        need = load.charged_tokens + q.charge_on(i).value - share * load.capacity_tokens
        if need <= 0.0:
            return wait
        step = speed.step_s + speed.per_seq_s * max(1, load.running)
        freed = 0.0
        for held in sorted(load.holdings, key=lambda h: h.remaining):
            freed += held.value
            if freed >= need:
                return wait + held.remaining * step
        return float("inf")


def _predicted_output(request: object) -> float:
    """The request's predicted mean output (1 token without a prediction)."""
    predicted = getattr(request, "predicted_output", None)
    return float(predicted()) if callable(predicted) else 1.0
