"""A request inside a simulated engine, and the states it moves through (vLLM v1's ``RequestStatus``).

WAITING → RUNNING → FINISHED, with RUNNING → PREEMPTED → RUNNING when the KV pool runs dry or a
preemptive policy displaces it, and ABORTED from any unfinished state when the client goes away.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sagegate.policies.base import SchedRequest
from sagegate.sim.kv import BlockTable
from sagegate.sim.prefix import BlockKeys


class RequestStatus(StrEnum):
    WAITING = "waiting"  # queued, never admitted
    RUNNING = "running"  # in the running batch, holding KV blocks
    PREEMPTED = "preempted"  # evicted by recompute: queued again, holding no blocks
    FINISHED = "finished"  # produced its last output token
    ABORTED = "aborted"  # cancelled (client gone) before it finished

    @property
    def is_queued(self) -> bool:
        """In the engine's waiting queue (never admitted, or preempted)."""
        return self is RequestStatus.WAITING or self is RequestStatus.PREEMPTED

    @property
    def is_done(self) -> bool:
        """Finished or aborted: the engine holds nothing for it any more."""
        return self is RequestStatus.FINISHED or self is RequestStatus.ABORTED


# Module-level aliases: the hot loops compare by identity (``state is RUNNING``) on a global name,
# never by looking a member up on the class.
WAITING = RequestStatus.WAITING
RUNNING = RequestStatus.RUNNING
PREEMPTED = RequestStatus.PREEMPTED
FINISHED = RequestStatus.FINISHED
ABORTED = RequestStatus.ABORTED


class EngineRequest(SchedRequest):
    """A request inside an engine: what the policy sees plus the engine's own progress."""

    __slots__ = (
        "backend",
        "cached_tokens",
        "cohort_tick",
        "keys",
        "num_computed",
        "output_tokens",
        "preemptions",
        "state",
        "t_dispatch",
        "t_engine",
        "t_finish",
        "t_first_token",
        "table",
        "user",
    )

    def __init__(
        self,
        rid: Any,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        *,
        hash_ids: tuple[int, ...] | None = None,
        prompt: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(rid, arrival_s, prompt_tokens, **kw)
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        self.output_tokens = output_tokens
        self.num_computed = 0
        self.table = BlockTable()
        self.keys: BlockKeys | Any = (hash_ids, prompt)  # resolved to BlockKeys on first admission
        self.state: RequestStatus = WAITING
        self.preemptions = 0
        self.cached_tokens = 0
        self.cohort_tick = -1  # in the engine's decode cohort since this tick (``sim.decode_cohort``)
        self.t_dispatch = arrival_s
        self.t_engine = arrival_s
        self.t_first_token: float | None = None
        self.t_finish: float | None = None
        self.backend = 0
        self.user: Any = None  # the driver's own handle (e.g. the server's token channel)

    @property
    def known_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold before the next token."""
        return self.prompt_tokens + self.generated
