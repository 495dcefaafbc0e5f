"""The gateway's queued request and its bounded, policy-ordered queue.

Ordering is ``policies.queue.PolicyQueue`` (the simulator's own queue); this adds the bounds (requests
and prompt tokens) and the future a waiting handler sleeps on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from sagegate.core.distribution import LengthDistribution
from sagegate.core.outcomes import PredictionPath
from sagegate.policies.admission import Charge
from sagegate.policies.base import SchedRequest
from sagegate.policies.interfaces import QueueOrder
from sagegate.policies.queue import PolicyQueue

if TYPE_CHECKING:
    from sagegate.gateway.tokens import ExactKeys
    from sagegate.gateway.tracing import RequestTrace


class DispatchRefused(Exception):
    """A queued request will never be dispatched (set on its future): ``reason`` says why (the policy
    rejected it, or no backend is healthy)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueueFull(Exception):
    """The queue's bounds refuse a new request: ``reason`` says which (a 429)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GatewayRequest(SchedRequest):
    """A live request: what the policy reads, plus the HTTP side of it (``body`` is forwarded as
    sent; what the gateway acts on is read once, from the validated request, into typed fields)."""

    __slots__ = (
        "attempt",
        "backend",
        "block_tokens",
        "body",
        "charge",
        "charged_prompt",
        "exact",
        "excluded",
        "future",
        "max_tokens",
        "model",
        "output_tokens",
        "pauses",
        "predicted_cached",
        "prediction_path",
        "prefix_claim",
        "prefix_hits",
        "prefix_keys",
        "prompt",
        "request_id",
        "resumed_from",
        "route",
        "session",
        "stream",
        "t_dispatch",
        "t_enqueue",
        "t_first",
        "trace",
        "want_usage",
    )

    def __init__(
        self,
        rid: Any,
        arrival_s: float,
        prompt_tokens: int,
        *,
        body: dict[str, Any],
        route: str,
        model: str,
        prompt: Any,
        tenant: str = "default",
        priority: int = 1,
        deadline_s: float | None = None,
        prediction: LengthDistribution | None = None,
        prediction_path: str = PredictionPath.NONE,
        stream: bool = False,
        want_usage: bool = False,
        max_tokens: int | None = None,
        request_id: str = "",
    ) -> None:
        super().__init__(
            rid, arrival_s, prompt_tokens, tenant=tenant, priority=priority, deadline_s=deadline_s,
            prediction=prediction,
        )  # fmt: skip
        self.body = body
        self.route = route
        self.model = model
        self.prompt = prompt
        self.prediction_path = prediction_path
        """How the predictor made ``prediction`` (a :class:`PredictionPath` value)."""
        self.stream = stream
        self.want_usage = want_usage
        """The client asked for the usage chunk (``stream_options.include_usage``)."""
        self.max_tokens = max_tokens
        """The client's cap on the output (``max_completion_tokens`` or ``max_tokens``)."""
        self.charge: Charge | None = None
        self.charged_prompt = 0
        """The prompt tokens ``charge`` counts (the prompt's share, see ``policies.prompt_share``)."""
        self.backend: int | None = None
        self.excluded: set[int] = set()
        self.attempt = 0
        self.future: asyncio.Future[int] | None = None
        self.t_enqueue = arrival_s
        self.t_dispatch: float | None = None
        self.t_first: float | None = None
        """When the client's first token left (its first try's first byte)."""
        self.trace: RequestTrace | None = None
        """Its spans (``tracing.enabled``)."""
        self.output_tokens: int | None = None
        """The output the client was sent, once it ended (rate limits count it)."""
        self.request_id = request_id or str(rid)
        """The client's id for it (``gateway.access_log``): answers, upstream tries and the access log."""
        self.pauses = 0
        """Times the gateway paused it (``gateway.resume``)."""
        self.resumed_from = 0
        """Tokens it had generated when its current try was dispatched (a continuation's prompt holds
        them: the backend prefills ``prompt_tokens + resumed_from``)."""
        # Cache-aware placement (``gateway.locality``): the prompt's block keys, the tokens one block
        # stands for, the client's session, each backend's predicted cached tokens at the last
        # decision, and those of the backend it was sent to.
        self.prefix_keys: list[int] = []
        self.block_tokens = 0.0
        self.session: str | None = None
        self.prefix_hits: list[int] | None = None
        self.predicted_cached = 0
        self.prefix_claim: tuple[Hashable, ...] | None = None
        """Its blocks claimed on the backend it was sent to, until the backend computes it (or it
        leaves first): ``policies.prefix_index``."""
        self.exact: ExactKeys | None = None
        """Its prompt's token-id block keys, while some backend is precise (``gateway.kv_events``)."""

    @property
    def upstream_prompt(self) -> int:
        """The prompt the backend prefills on this try: the prompt, plus the text a continuation
        carries."""
        return self.prompt_tokens + self.resumed_from


class BoundedQueue:
    """A :class:`PolicyQueue` with a cap on queued requests and on their prompt tokens."""

    def __init__(self, policy: QueueOrder, max_requests: int, max_tokens: int) -> None:
        self.q: PolicyQueue[GatewayRequest] = PolicyQueue(policy)
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.q)

    def full_reason(self, req: GatewayRequest) -> str | None:
        """Why ``req`` may not join, or None."""
        if len(self.q) >= self.max_requests:
            return "queue_full_requests"
        if self.tokens + req.prompt_tokens > self.max_tokens and len(self.q) > 0:
            return "queue_full_tokens"
        return None

    def push(self, req: GatewayRequest, now: float) -> None:
        self.q.push(req, now)
        self.tokens += req.prompt_tokens

    def remove(self, req: GatewayRequest) -> bool:
        if self.q.remove(req):
            self.tokens -= req.prompt_tokens
            return True
        return False

    def peek(self, now: float) -> GatewayRequest | None:
        return self.q.peek(now)

    def place_again(self, req: GatewayRequest, now: float) -> None:
        self.q.place_again(req, now)

    def ordered(self, now: float, limit: int | None = None) -> list[GatewayRequest]:
        return self.q.ordered(now, limit)
