"""What one engine step is and what it did: the scheduler's output and the step's outcome.

:meth:`sim.engine.Engine.schedule` returns a :class:`SchedulerOutput` (vLLM v1's name): who runs how
many tokens and for how long. The driver waits ``duration`` on its clock, then hands it back to
:meth:`sim.engine.Engine.complete`, which returns a :class:`StepOutcome`: whose tokens came out.
Both are frozen: a driver reads them and never changes a step behind the engine's back.

One of each is built per step, so their ``__init__`` is written by hand: the one ``dataclass``
generates for a frozen class calls ``object.__setattr__`` per field, which cost about 5 % of the
simulator's CPU (CPython 3.11, counted with callgrind); filling the instance dict directly costs
about half that (a mutable slots class would cost nothing). ``tests/test_engine_steps.py`` checks
that every field is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine_request import EngineRequest


@dataclass(frozen=True, init=False)
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

    def __init__(
        self,
        start: float,
        duration: float,
        scheduled: dict[EngineRequest, int],
        k: int,
        preempted: int,
        chunked: list[EngineRequest],
    ) -> None:
        fields = self.__dict__
        fields["start"] = start
        fields["duration"] = duration
        fields["scheduled"] = scheduled
        fields["k"] = k
        fields["preempted"] = preempted
        fields["chunked"] = chunked


@dataclass(frozen=True, init=False)
class StepOutcome:
    """What a completed step produced, for the driver to deliver."""

    emitted: list[EngineRequest]
    """Requests that produced tokens (``k`` each for a folded step), in schedule order."""
    finished: list[EngineRequest]
    """Of ``emitted``, those that produced their last token (the engine has freed them)."""
    first: list[EngineRequest]
    """Of ``emitted``, those whose first token this was."""

    def __init__(
        self, emitted: list[EngineRequest], finished: list[EngineRequest], first: list[EngineRequest]
    ) -> None:
        fields = self.__dict__
        fields["emitted"] = emitted
        fields["finished"] = finished
        fields["first"] = first
