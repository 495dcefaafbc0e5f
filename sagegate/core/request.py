"""The request as a trace and the gateway know it, and the query a predictor is asked.

:class:`TraceRequest` is what every reader produces and every driver (simulator, replay client)
consumes; it carries the true output length. :class:`PredictionQuery` is what a predictor sees: the
same request without its outcome, so no predictor can read the answer by accident.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

DEFAULT_CLIENT_MAX_TOKENS = 4096
"""The ``max_tokens`` a replay sends for a request whose trace records no cap of its own: a realistic
chat client's cap, never the request's true output length (which would hand a scheduler the answer)."""

FORCED_OUTPUT_FIELD = "sim_output_tokens"
"""The body field that tells a *simulated* backend exactly how many tokens to generate (a trace's true
output length). Only ``sagegate backend`` reads it; the gateway forwards it untouched and never reads
it; a real vLLM ignores it, so its outputs are the model's own."""


DEFAULT_PRIORITY = 1
"""A request's priority band when it names none (higher is served first: ``x-priority``)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload, as a trace describes it.

    ``arrival_s`` is seconds from the start of the workload. ``output_tokens`` is the true output length:
    a replay sends it only in :data:`FORCED_OUTPUT_FIELD`, which no scheduler reads. ``max_tokens`` is
    the client's cap, what a replay sends as ``max_tokens`` (None: the trace records none; see
    :func:`with_client_cap`). ``hash_ids`` names the prompt's prefix blocks (Mooncake: one id per 512
    tokens; equal ids mean equal content).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    rid: int = 0
    prompt: str | None = None
    tenant: str = "default"
    priority: int = DEFAULT_PRIORITY
    deadline_s: float | None = None
    hash_ids: tuple[int, ...] | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)
    max_tokens: int | None = None

    def with_arrival(self, arrival_s: float) -> TraceRequest:
        return replace(self, arrival_s=arrival_s)


@dataclass(frozen=True, slots=True)
class PredictionQuery:
    """What a predictor is asked about one request: its prompt and who sent it, never its outcome.

    ``rid`` identifies the request within a run (the simulator's oracles key their answer key by it);
    ``prompt`` is the prompt text when the trace or the client has it; ``model`` the served model the
    request names (None: the predictor's default).
    """

    rid: int
    prompt_tokens: int
    prompt: str | None = None
    tenant: str = "default"
    model: str | None = None
    max_tokens: int | None = None
    wait_s: float | None = None
    """The longest the caller waits for work done off its thread (an embedding): None, the
    predictor's own budget; 0, answer from memory now and send the rest as ``Prediction.later``."""

    @classmethod
    def of(cls, req: TraceRequest) -> PredictionQuery:
        """The query for a trace request: everything but its output length."""
        model = req.extra.get("model") if req.extra else None
        return cls(
            rid=req.rid,
            prompt_tokens=req.prompt_tokens,
            prompt=req.prompt,
            tenant=req.tenant,
            model=model if isinstance(model, str) else None,
            max_tokens=req.max_tokens,
        )


def prompt_digest(text: str) -> int:
    """A 64-bit digest of a prompt's text: how a prompt is named without shipping it (the ranking
    head's shipped prior lists the prompts it was fitted on, so that replays can leave them out)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def answer_key(requests: Iterable[TraceRequest]) -> dict[int, int]:
    """Each request's true output length by ``rid``: what an oracle predictor is explicitly handed.

    Raises ``ValueError`` when two requests share a ``rid`` with different outputs (the key would be
    ambiguous, and an oracle silently wrong).
    """
    key: dict[int, int] = {}
    for r in requests:
        if key.setdefault(r.rid, r.output_tokens) != r.output_tokens:
            raise ValueError(f"requests share rid {r.rid} with different outputs: number them (rebase)")
    return key


def truth_of(key: Mapping[int, int], query: PredictionQuery) -> int:
    """The true output of ``query`` from an answer key (``KeyError`` names the request)."""
    try:
        return key[query.rid]
    except KeyError:
        raise KeyError(f"request {query.rid} is not in the oracle's answer key") from None
