"""Memory-aware admission: the one rule the live gateway and the simulated gateway both apply.

Each backend has a KV capacity in tokens. Every request in flight on it is *charged* its prompt, what
it has generated, and its predicted remaining output (a quantile of the predicted distribution given
that it has already run past what it generated), corrected as tokens stream. By default (rule
``"peak"``) a backend admits while the most KV its requests will hold at once, each growing to its
predicted end and then freeing its blocks, stays within capacity; the older rule ``"sum"`` bounds the
sum of whole charges instead. Either way the requests it reports waiting must stay under
``max_waiting`` requests and ``max_waiting_tokens`` prompt tokens; among the backends that admit,
the one with the most uncharged room wins.

The rule's single job is to keep every backend saturated but not overflowing: holding back more only
buys a queue to reorder, at the price of throughput; letting in more only buys preemptions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import DEFAULT_PRIORITY
from sagegate.policies.engine_speed import EngineSpeed
from sagegate.policies.holdings import Holdings
from sagegate.policies.resident import PromptBlocks, ResidentBlocks

Rule = Literal["sum", "peak"]
RULES: tuple[str, ...] = get_args(Rule)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    quantile: float = 0.5
    """Quantile of the predicted remaining output charged for a request."""
    target: float = 1.5
    """Rule ``"sum"``: share of KV capacity the charges may fill. Above 1 on purpose: a request is
    charged its whole predicted footprint from the start, but holds on average only ``I + O/2`` over
    its life (tuned in the simulator, see docs/journal/BENCHMARKS.md, *Admission tuning*: 1.2 and below
    starved memory-bound engines). Both rules route to the backend with the most room under it."""
    max_waiting: int = 256
    """A backend with this many requests waiting (not yet running) admits nothing more."""
    unknown_output: int = 256
    """Charge for output when a request has no prediction."""
    max_waiting_tokens: int = 2048
    """A backend with waiting requests admits another only while their prompt tokens stay within
    this: enough backlog to keep the next step busy, shallow enough that the order stays the
    gateway's to decide. (Tuned in the simulator, see docs/journal/BENCHMARKS.md, *Admission tuning*: a
    cap of one waiting request starved engines serving many small requests; a deep backlog gave the
    ordering away.)"""
    rule: Rule = "peak"
    """``"peak"``: a backend admits while the most KV its requests will hold *at once* (each growing
    by a token a step until its predicted end, finished ones freeing theirs; see :class:`Holdings`)
    stays under ``peak_target`` × capacity. ``"sum"``: while the sum of the whole charges stays
    under ``target`` × capacity. Over 48 simulated cells (RESULTS.md, *Admission*) ``"peak"`` at 1.0 was
    never slower than vLLM alone and cut preemptions further than ``"sum"`` at 1.5."""
    peak_target: float = 1.0
    """Share of KV capacity the projected peak may reach (rule ``"peak"``; 0.97 cut preemptions to
    near zero in the simulator but cost up to 4% of throughput with an uninformative predictor)."""
    band_reserve: float = 0.0
    """Share of what the rule allows that only requests above the default priority band may fill
    (:meth:`for_band`): room a higher band finds at once, however hard the default band floods,
    instead of waiting for a departure or a pause. The default band loses that share of each
    backend's memory even when no higher band comes (0: none kept)."""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"admission rule must be one of {', '.join(RULES)}, not {self.rule!r}")
        if self.peak_target <= 0:
            raise ValueError("admission peak_target must be positive")
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError("admission quantile must be in [0, 1]")
        if self.target <= 0:
            raise ValueError("admission target must be positive")
        if self.max_waiting < 1:
            raise ValueError("admission max_waiting must be at least 1")
        if self.max_waiting_tokens < 1:
            raise ValueError("admission max_waiting_tokens must be at least 1")
        if not 0.0 <= self.band_reserve < 1.0:
            raise ValueError("admission band_reserve must be in [0, 1)")

    def for_band(self, priority: int) -> AdmissionConfig:
        """The rule a request of ``priority`` is admitted under: this one above the default band;
        at or below it, the targets less ``band_reserve``."""
        if priority > DEFAULT_PRIORITY or self.band_reserve == 0.0:
            return self
        return _reserved(self)


@functools.lru_cache(maxsize=16)
def _reserved(cfg: AdmissionConfig) -> AdmissionConfig:
    """``cfg`` with its targets less ``band_reserve`` (built once per config: every dispatch and
    every shared-ledger commit asks)."""
    keep = 1.0 - cfg.band_reserve
    return replace(cfg, target=cfg.target * keep, peak_target=cfg.peak_target * keep, band_reserve=0.0)


def predicted_total(pred: LengthDistribution | None, generated: int, quantile: float, unknown: int) -> int:
    """Predicted total output of a request that has generated ``generated`` tokens: the ``quantile``
    of the distribution conditioned on ``O > generated`` (past the support: a further 25%)."""
    if pred is None:
        return max(unknown, generated + 1)
    support, probs = pred.support, pred.probs
    tail = 0.0
    for o, p in zip(support, probs, strict=True):
        if o > generated:
            tail += p
    if tail <= 0.0:
        return generated + max(1, generated // 4)
    goal = quantile * tail
    acc = 0.0
    for o, p in zip(support, probs, strict=True):
        if o > generated:
            acc += p
            if acc >= goal - 1e-12:
                return o
    return support[-1]


class Charge:
    """A request's KV charge: ``prompt + max(generated, predicted total given generated)``.

    The predicted total is the quantile of the output distribution conditioned on ``O > generated``,
    which only changes when ``generated`` passes a support point, so it is recomputed only then. The
    charge is a function of ``generated`` alone — not of how often it was updated — so a simulator
    that folds many decode steps into one event charges exactly what a token-by-token stream does.
    """

    __slots__ = (
        "_cfg",
        "_generated",
        "_next",
        "_pred",
        "_prompt",
        "_sharing",
        "_total",
        "_whole",
        "blocks",
        "held",
        "remaining",
        "started",
        "value",
    )

    def __init__(
        self,
        prompt_tokens: int,
        pred: LengthDistribution | None,
        cfg: AdmissionConfig,
        blocks: PromptBlocks | None = None,
    ) -> None:
        self._prompt: float = prompt_tokens
        """Its prompt tokens charged to it (less blocks it gave to the backend, :meth:`drop`)."""
        self._generated = 0
        self._pred = pred
        self._cfg = cfg
        self._next = 0
        self._total = 0
        self._sharing: Charge | None = None
        self._whole: Charge | None = None  # the charge this one leaves shared blocks out of
        self.blocks = blocks
        """Its prompt's cacheable blocks (None: not known, no prefix sharing is charged for)."""
        self.held = prompt_tokens
        """KV it holds now: its prompt and what it has generated."""
        self.remaining = 0
        """Predicted tokens still to generate (the charge less what it holds now)."""
        self.value = 0.0
        self.started = False
        """It has produced a token where it is charged (its prompt's blocks are computed there)."""
        self._recompute(0)

    def sharing(self, shared: int) -> Charge:
        """This charge on a backend where a request in flight already holds its first ``shared``
        blocks: without them (the last prompt token is always its own). The same object while
        ``shared`` and the progress stay (a held head asked again costs nothing)."""
        blocks = self.blocks
        if blocks is None:
            return self
        whole = self._whole
        if whole is not None:
            return whole.sharing(shared)
        if shared <= 0:
            return self
        memo = self._sharing
        generated = self._generated
        if (
            memo is not None
            and memo.blocks is not None
            and memo.blocks.shared == shared
            and memo._generated == generated
        ):
            return memo
        prompt = round(self._prompt - min(self._prompt - 1, shared * blocks.tokens))
        memo = Charge(prompt, self._pred, self._cfg, PromptBlocks(blocks.keys, blocks.tokens, shared))
        if generated:
            memo.update(generated)
        memo._whole = self
        self._sharing = memo
        return memo

    def drop(self, tokens: float) -> float:
        """Stop charging ``tokens`` of its prompt: blocks it brought that others now share, charged to
        the backend instead (``policies.resident``). Returns how much the charge fell (the caller
        moves the backend's books)."""
        old = self.value
        whole = self._whole
        if whole is not None and whole._sharing is self:
            whole._sharing = None  # no longer what the whole charge costs there
        self._prompt -= tokens
        self._set(self._generated)
        return old - self.value

    def _recompute(self, generated: int) -> None:
        cfg = self._cfg
        self._total = predicted_total(self._pred, generated, cfg.quantile, cfg.unknown_output)
        # The conditioning event O > generated next changes at the first support point ≥ it.
        nxt = -1
        if self._pred is not None:
            for o in self._pred.support:
                if o > generated:
                    nxt = o
                    break
        # Past the support (or with no prediction) the estimate follows every token.
        self._next = nxt if nxt > 0 else generated + 1
        self._set(generated)

    def _set(self, generated: int) -> None:
        self._generated = generated
        total = self._total
        prompt = round(self._prompt)  # whole tokens (the shared ledger's wire carries integers)
        self.held = prompt + generated
        self.remaining = total - generated if total > generated else 0
        self.value = float(prompt + (total if total > generated else generated))

    def repredict(self, pred: LengthDistribution | None) -> float:
        """The charge by another prediction (one that came after the request was sent), at the
        progress it has made; returns the change."""
        old = self.value
        self._pred = pred
        self._sharing = None  # (made from the old prediction)
        if self._whole is not None:
            self._whole._pred = pred
            self._whole._recompute(self._whole._generated)
        self._recompute(self._generated)
        return self.value - old

    def update(self, generated: int) -> float:
        """New charge after ``generated`` tokens; returns the change."""
        old = self.value
        if generated >= self._next:
            self._recompute(generated)
        else:
            self._set(generated)
        return self.value - old


@dataclass(slots=True)
class BackendLoad:
    """What the gateway knows of one backend when it decides."""

    capacity_tokens: int
    charged_tokens: float = 0.0
    waiting: int = 0
    running: int = 0
    healthy: bool = True
    waiting_tokens: int = 0
    """Prompt tokens of the waiting requests (the backlog the next step can take)."""
    foreign_waiting: int = 0
    """Other gateway replicas' requests sent here since their last scrape (as the shared ledger last
    read them): waiting requests this replica's own estimate cannot see yet. Zero alone."""
    foreign_waiting_tokens: int = 0
    """Their prompt tokens."""
    prefix_hit_ratio: float = 0.0
    """The share of prompt tokens the backend's prefix cache has served (its own counters): how much of
    a waiting prompt it will not compute (``policies.placement`` discounts queued work by it)."""
    speed: EngineSpeed | None = None
    """How fast it goes, as learned from its counters (``policies.engine_speed``); None: not known
    (the ``forecast`` placement's own assumption stands)."""
    holdings: Holdings = field(default_factory=Holdings)
    resident: ResidentBlocks = field(default_factory=ResidentBlocks)
    """The prompt blocks its charged requests hold, each charged once (``charged_tokens`` includes
    ``resident.pinned_tokens``: blocks whose payer left and that others still use)."""

    def room(self, target: float) -> float:
        return target * self.capacity_tokens - self.charged_tokens

    @property
    def queued_prefill(self) -> float:
        """Prompt tokens waiting here that the backend's prefix cache will not serve (by its hit ratio)."""
        return (self.waiting_tokens + self.foreign_waiting_tokens) * (1.0 - self.prefix_hit_ratio)

    def charge(self, charge: Charge) -> None:
        """A request was dispatched here."""
        self.charged_tokens += charge.value
        self.holdings.add(charge)
        if charge.blocks is not None:
            moved = self.resident.enter(charge, charge.blocks)
            if moved is not None:  # charges it shares blocks with gave them to the backend
                self.charged_tokens += moved
                self.holdings.changed()

    def progress(self, charge: Charge, generated: int) -> float:
        """One of its requests has generated ``generated`` tokens so far; returns how much its charge
        moved (positive: it ran past what was predicted and its footprint grew)."""
        moved = charge.update(generated)
        self.charged_tokens += moved
        self.holdings.changed()
        if not charge.started and generated > 0:
            charge.started = True
            if charge.blocks is not None:
                self.resident.started(charge.blocks)
        return moved

    def repredict(self, charge: Charge, pred: LengthDistribution | None) -> float:
        """One of its requests is charged by a prediction that came after it was sent; returns how
        much its charge moved."""
        moved = charge.repredict(pred)
        self.charged_tokens += moved
        self.holdings.changed()
        return moved

    def release(self, charge: Charge) -> None:
        """One of its requests left."""
        self.charged_tokens -= charge.value
        self.holdings.discard(charge)
        if charge.blocks is not None:
            self.charged_tokens += self.resident.leave(charge, charge.blocks, charge.started)
        if not len(self.holdings):
            self.charged_tokens = 0.0  # no float drift on an idle backend

    def admits(self, charge: Charge, cfg: AdmissionConfig) -> bool:
        """Whether ``charge`` fits under the rule (waiting bounds aside)."""
        if self.charged_tokens <= 0.0:
            return True  # an idle backend always admits: a request larger than any target still runs
        if cfg.rule == "sum":
            return self.room(cfg.target) >= charge.value
        limit = cfg.peak_target * self.capacity_tokens
        if self.charged_tokens + charge.value <= limit:
            return True  # the peak never exceeds the sum of footprints
        return self.holdings.fits(charge, limit - self.resident.pinned_tokens)


def choose_backend(
    charge: Charge | Sequence[Charge],
    backends: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    prompt_tokens: int = 0,
    allowed: Sequence[bool] | None = None,
) -> int | None:
    """Index of the healthy backend with the most room that admits ``charge``, or None.

    ``charge`` may be one per backend (what the request costs on each: ``shared_charges``).
    ``allowed``, if given, masks out backends this request may not use.
    """
    best: int | None = None
    best_room = float("-inf")
    for i, b in enumerate(backends):
        if not eligible(b, i, cfg, prompt_tokens, allowed):
            continue
        room = b.room(cfg.target)
        if room > best_room and b.admits(charge if isinstance(charge, Charge) else charge[i], cfg):
            best, best_room = i, room
    return best


def shared_charges(charge: Charge, backends: Sequence[BackendLoad]) -> list[Charge] | None:
    """``charge`` on each backend, without the leading blocks a request in flight there already
    holds (``policies.resident``); None when no backend holds any (the one charge everywhere)."""
    blocks = charge.blocks
    if blocks is None or not blocks.keys:
        return None
    out: list[Charge] | None = None
    for i, b in enumerate(backends):
        n = b.resident.shared(blocks.keys)
        if n:
            if out is None:
                out = [charge] * len(backends)
            out[i] = charge.sharing(n)
    return out


def resident_prefix(charge: Charge, backends: Sequence[BackendLoad]) -> int:
    """The most of ``charge``'s prompt a request in flight on some backend already holds (computed):
    the prompt tokens it would not add to that backend's KV (0 where its blocks are not known)."""
    blocks = charge.blocks
    if blocks is None or not blocks.keys:
        return 0
    n = max((b.resident.shared(blocks.keys) for b in backends), default=0)
    return min(charge.held - 1, round(n * blocks.tokens)) if n else 0


def eligible(
    b: BackendLoad,
    i: int,
    cfg: AdmissionConfig,
    prompt_tokens: int,
    allowed: Sequence[bool] | None,
    cached: int | None = None,
) -> bool:
    """Whether backend ``b`` (index ``i``) may take a request now, memory aside: healthy, allowed,
    and its waiting list within ``max_waiting`` requests and ``max_waiting_tokens`` prompt tokens.
    With ``cached`` (the request's prompt tokens predicted cached there, ``policies.placement``) the
    backlog is counted in prefill the backend will do: a warm backend with a waiting request whose
    prompt is mostly cached still takes one more."""
    waiting = b.waiting + b.foreign_waiting
    if not b.healthy or waiting >= cfg.max_waiting or (allowed is not None and not allowed[i]):
        return False
    backlog: float
    if cached is None:
        backlog = b.waiting_tokens + b.foreign_waiting_tokens + prompt_tokens
    else:
        backlog = b.queued_prefill + (prompt_tokens - cached)
    return not (waiting and backlog > cfg.max_waiting_tokens)


def usage_after(charge: float, idx: int | None, loads: Sequence[BackendLoad]) -> float:
    """A backend's charged share of capacity with ``charge`` added: the chosen one's, or (``idx``
    None: nobody admits) the least loaded one's. What a screening policy sees as KV usage."""
    if not loads:
        return 1.0
    if idx is None:
        idx = min(range(len(loads)), key=lambda i: loads[i].charged_tokens / loads[i].capacity_tokens)
    b = loads[idx]
    return (b.charged_tokens + charge) / b.capacity_tokens
