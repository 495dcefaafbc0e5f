"""What one engine step is and what it did: the scheduler's output and the step's outcome.

:meth:`sim.engine.Engine.schedule` returns a :class:`SchedulerOutput` (vLLM v1's name): who runs how
many tokens and for how long. The driver waits ``duration`` on its clock, then hands it back to
:meth:`sim.engine.Engine.complete`, which returns a :class:`StepOutcome`: whose tokens came out.
A driver reads them and never changes a step behind the engine's back. They are plain slots classes,
not frozen ones, as vLLM's are: one of each is built per step, and a frozen dataclass's ``__init__``
(``object.__setattr__`` per field) cost about 5 % of the simulator's CPU, hand-written inits about
2.5-4 %, slots about 0.4 % (CPython 3.11, counted with callgrind).
"""

from __future__ import annotations

from dataclasses import dataclass

from sagegate.sim.engine_request import EngineRequest


@dataclass(slots=True)
class SchedulerOutput:
    """A scheduled step (or ``k`` folded decode steps), timed."""

    start: float
    duration: float
    scheduled: dict[EngineRequest, int]
    """Tokens each request computes in the first step, in schedule order (empty: nothing fits)."""
    k: int
    """Decode steps folded into this one: with ``k > 1`` every scheduled request decodes ``k`` tokens."""
    preempted: int
    """Requests preempted (by recompute) while scheduling this step."""
    chunked: list[EngineRequest]
    """The scheduled requests with a prefill chunk rather than one decode token, in schedule order."""
    cohort: int = 0
    """Requests of the engine's decode cohort (``sim.decode_cohort``) that decode ``k`` tokens too, ahead
    of ``scheduled`` and not in it."""


@dataclass(slots=True)
class StepOutcome:
    """What a completed step produced, for the driver to deliver."""

    emitted: list[EngineRequest]
    """Requests that produced tokens (``k`` each for a folded step), in schedule order; the decode
    cohort's members are left out (an engine with ``lazy_decode`` does not list them)."""
    finished: list[EngineRequest]
    """Those that produced their last token, in schedule order (the engine has freed them); decode
    cohort members among them, though ``emitted`` leaves them out."""
    first: list[EngineRequest]
    """Of ``emitted``, those whose first token this was."""
