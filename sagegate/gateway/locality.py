"""Where prompts are cached across the fleet, as the gateway predicts it, for cache-aware placement.

Each backend keeps a :class:`policies.prefix_index.PrefixIndex` of the prompt blocks sent to it
(``Backend.prefix``, cleared when the backend goes down or restarts). A request's blocks are keyed
from its prompt as the engine will see it, chat messages rendered in order (``core.tokens``), so turn
k+1 of a conversation extends turn k block for block (``core.prefix``). For each queued head the
dispatch loop asks how many of its prompt tokens each backend holds (:meth:`Locality.cached`) and
``policies.placement`` weighs that against the work queued there.

A backend that publishes its KV-cache events (``gateway.kv_events``) and is following them whole is
*precise*: it answers from the blocks its engine reports cached, matched against the request's token
ids (keyed at enqueue, only while some backend is precise), and from the requests sent there and not
yet left (events report a block only once its prefill has computed it); the others answer from the
approximate index, which every backend keeps all along.

A client that names its session (``x-session-id``, as vllm-router and llm-d accept) is also credited,
on the backend its last turn went to, with that turn's prompt, where the index holds less (a
conversation whose rendered text is not an extension of the last turn still finds its KV). A session
is kept as a fixed-size digest of its id (:func:`session_key`), so memory is bounded in bytes by
``max_sessions``, whatever the ids' length.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from sagegate.core.lru import Lru
from sagegate.core.prefix import CHARS_PER_TOKEN, text_block_keys
from sagegate.core.tokens import flatten_messages
from sagegate.gateway.backends import Backend
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.settings import PlacementSettings
from sagegate.gateway.tokens import ExactKeys, backend_keys, exact_keys
from sagegate.gateway.upstream import Upstream
from sagegate.policies.placement import CacheView, classify
from sagegate.policies.prefix_index import InFlight

SESSION_KEY_BYTES = 16


def session_key(session_id: str) -> str:
    """A session id as the gateway keeps it and replicas share it: a 16-byte digest, in hex."""
    return hashlib.blake2b(
        session_id.encode("utf-8", "surrogatepass"), digest_size=SESSION_KEY_BYTES
    ).hexdigest()


def prompt_text(prompt: Any) -> str:
    """The prompt as the engine prefills it, as text: chat messages rendered in order, a completion
    prompt as is (token ids written out: equal ids, equal text)."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], dict):
        return flatten_messages(prompt)
    if prompt and isinstance(prompt[0], str | list):
        return "\n".join(prompt_text(p) for p in prompt)
    return ",".join(str(t) for t in prompt)


class Locality:
    """Cache-aware placement's gateway half (built only with ``placement.mode: cache_aware``)."""

    def __init__(
        self,
        settings: PlacementSettings,
        backends: Sequence[Backend],
        metrics: GatewayMetrics | None = None,
        client: Upstream | None = None,
    ) -> None:
        self.block_chars = settings.block_tokens * CHARS_PER_TOKEN
        self.block_tokens = settings.block_tokens
        self.backends = backends
        self.metrics = metrics
        self.kv_events = settings.kv_events
        self.client = client
        """For ``kv_events.tokenizer: backend`` (a backend's ``/tokenize``)."""
        self.sessions: Lru[str, tuple[int, int]] = Lru(settings.max_sessions)
        """Session (:func:`session_key`) → (the backend its last turn went to, that turn's prompt
        tokens), oldest first."""
        self.in_flight = [InFlight() for _ in backends]
        """Per backend, the blocks of the requests sent there and not yet left: what a precise
        backend will hold before its events say so (kept only for backends that publish events)."""
        self.on_touch: Callable[[int, Sequence[int], str | None, int], None] | None = None
        """Told each touch (backend, keys, session, prompt tokens): ``gateway.shared_prefixes``."""
        for b in backends:
            b.prefix_block_tokens = self.block_tokens
            b.prefix.resize(b.load.capacity_tokens // self.block_tokens)

    async def exact_keys(self, body: dict[str, Any], chat: bool) -> ExactKeys | None:
        """The prompt's token-id keys for the precise backends' block sizes (None while none is)."""
        precise = [b for b in self.backends if b.kv is not None and b.kv.block_size and b.kv.precise]
        if not precise:
            return None
        sizes = frozenset(b.kv.block_size for b in precise if b.kv is not None and b.kv.block_size)
        if self.kv_events.tokenizer == "local" or self.client is None:
            return await exact_keys(body.get("messages") if chat else body.get("prompt"), sizes)
        b = next((b for b in precise if b.serves(str(body.get("model")))), precise[0])
        return await backend_keys(self.client, b.url, body, chat, sizes, self.kv_events.tokenize_timeout_s)

    def describe(self, req: GatewayRequest, session: str | None, exact: ExactKeys | None = None) -> None:
        """Key ``req``'s prompt blocks (at enqueue: once per request, not per dispatch pass);
        ``exact``: its token-id keys (:meth:`exact_keys`)."""
        text = prompt_text(req.prompt)
        req.prefix_keys = text_block_keys(text, self.block_chars)
        req.block_tokens = req.prompt_tokens * self.block_chars / max(1, len(text))
        req.session = session
        req.exact = exact

    def cached(self, req: GatewayRequest) -> CacheView:
        """The prompt tokens each backend is predicted to hold, and what each holds in all."""
        per = req.block_tokens
        # whole blocks only, and not the one holding the last token (always computed), as an engine
        most = int((req.prompt_tokens - 1) // per) if per > 0 else 0
        keys = req.prefix_keys
        hits = [int(min(most, b.prefix.match(keys)) * per) for b in self.backends]
        exact = req.exact
        known: set[int] = set()
        """The precise backends: what they hold is known, no session credit is needed."""
        if exact is not None:
            for i, b in enumerate(self.backends):
                kv = b.kv
                if kv is not None and kv.block_size in exact.keys and kv.precise:
                    bs = kv.block_size
                    hits[i] = min((exact.tokens - 1) // bs, kv.index.match(exact.keys[bs])) * bs
                    flying = self.in_flight[i]
                    if flying:  # a prefill in progress there: its blocks are not in the events yet
                        hits[i] = max(hits[i], int(min(most, flying.match(keys)) * per))
                    known.add(i)
        if req.session is not None:
            last = self.sessions.peek(req.session)
            if last is not None and last[0] < len(hits) and last[0] not in known:
                hits[last[0]] = max(hits[last[0]], min(int(most * per), last[1]))
        req.prefix_hits = hits
        return CacheView(hits, [self._held(b) for b in self.backends])

    def _held(self, b: Backend) -> int:
        kv = b.kv
        if kv is not None and kv.block_size is not None and kv.precise:
            return len(kv.index) * kv.block_size
        return len(b.prefix) * self.block_tokens

    def sent(self, req: GatewayRequest, backend: int) -> None:
        """``req`` went to ``backend``: its blocks are claimed there until it is computed
        (:meth:`computed`), so that what follows it with the same prefix goes there too."""
        b = self.backends[backend]
        hits = req.prefix_hits
        req.predicted_cached = hits[backend] if hits is not None else 0
        if self.metrics is not None:
            self.metrics.placed(b.name, classify(hits, backend), req.prompt_tokens, req.predicted_cached)
        req.prefix_claim = b.prefix.claim(req.prefix_keys)
        if b.kv is not None:
            b.kv.note_sent()
            self.in_flight[backend].add(req.rid, req.prefix_keys)

    def computed(self, req: GatewayRequest, backend: int) -> None:
        """``backend`` accepted ``req`` and computed its prompt (its first token, or its whole answer):
        the blocks are cached there now, and the session's last turn is there."""
        claim = req.prefix_claim
        if claim is None:  # computed already (a resumed try is a new dispatch: claimed anew)
            return
        req.prefix_claim = None
        prefix = self.backends[backend].prefix
        prefix.settle(claim)
        prefix.touch(req.prefix_keys)
        if self.on_touch is not None:
            self.on_touch(backend, req.prefix_keys, req.session, req.prompt_tokens)
        if req.session is not None:
            self.sessions.put(req.session, (backend, req.prompt_tokens))

    def left(self, req: GatewayRequest, backend: int) -> None:
        """``req`` left ``backend``: the engine freed its blocks, which join its eviction order last;
        a try that was never computed (refused, failed, cancelled first) leaves nothing cached."""
        self.in_flight[backend].remove(req.rid)
        claim = req.prefix_claim
        if claim is not None:
            req.prefix_claim = None
            self.backends[backend].prefix.settle(claim)
            return
        if req.prefix_keys:
            self.backends[backend].prefix.touch(req.prefix_keys)
            if self.on_touch is not None:
                self.on_touch(backend, req.prefix_keys, None, 0)
