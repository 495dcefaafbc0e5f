"""Reading the few vLLM metrics admission needs out of a backend's Prometheus text.

A full Prometheus parser costs milliseconds on vLLM's histogram-heavy output; this reads only the
lines it wants (summing over label sets, e.g. several engines behind one server).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from sagegate.policies.engine_speed import SpeedFit

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(slots=True)
class EngineMetrics:
    waiting: int = 0
    running: int = 0
    kv_usage: float | None = None
    preemptions: int = 0
    capacity_tokens: int | None = None
    """``num_gpu_blocks × block_size`` from ``vllm:cache_config_info``."""
    block_size: int | None = None
    """``block_size`` from ``vllm:cache_config_info`` (the first engine's, if several)."""
    prefix_queries: float | None = None
    """``vllm:prefix_cache_queries_total`` (tokens looked up in the prefix cache; None: not reported)."""
    prefix_hits: float | None = None
    """``vllm:prefix_cache_hits_total`` (tokens found there)."""
    prompt_tokens: float | None = None
    """``vllm:prompt_tokens_total``: with the two above, a counter that falls says the engine restarted."""
    generation_tokens: float | None = None
    """``vllm:generation_tokens_total``: with the prompt and cache counters, the engine's speed
    (``policies.engine_speed``)."""


_NAMES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}


def parse_metrics(text: str) -> EngineMetrics:
    out = EngineMetrics()
    sums: dict[str, float] = {}
    kv: list[float] = []
    blocks = 0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if space < 0:
            continue
        labelled = 0 <= brace < space
        name = line[: brace if labelled else space]
        end = line.rfind("}") + 1 if labelled else space
        if name == "vllm:cache_config_info":
            labels = dict(_LABEL.findall(line[brace:end])) if labelled else {}
            with contextlib.suppress(KeyError, ValueError):
                blocks += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
                out.block_size = out.block_size or int(labels["block_size"])
            continue
        field = _NAMES.get(name)
        if field is None:
            continue
        try:
            value = float(line[end:].split()[0])
        except (ValueError, IndexError):
            continue
        if field == "kv_usage":
            kv.append(value)
        else:
            sums[field] = sums.get(field, 0.0) + value
    out.waiting = int(sums.get("waiting", 0))
    out.running = int(sums.get("running", 0))
    out.preemptions = int(sums.get("preemptions", 0))
    out.kv_usage = max(kv) if kv else None
    out.capacity_tokens = blocks or None
    out.prefix_queries = sums.get("prefix_queries")
    out.prefix_hits = sums.get("prefix_hits")
    out.prompt_tokens = sums.get("prompt_tokens")
    out.generation_tokens = sums.get("generation_tokens")
    return out


def restarted(before: EngineMetrics | None, after: EngineMetrics) -> bool:
    """Whether a counter fell between two scrapes (the engine restarted, its cache empty)."""
    if before is None:
        return False
    pairs = (
        (before.prefix_queries, after.prefix_queries),
        (before.prompt_tokens, after.prompt_tokens),
        (float(before.preemptions), float(after.preemptions)),
    )
    return any(a is not None and b is not None and b < a for a, b in pairs)


class SpeedFromScrapes:
    """An engine's speed learned from its counters (``policies.engine_speed.SpeedFit``): each interval
    between two scrapes in which it was busy throughout (requests running or waiting at both ends)
    gives the prompt tokens it computed and the tokens it generated, at its mean running batch."""

    __slots__ = ("_last", "fit")

    def __init__(self, fit: SpeedFit) -> None:
        self.fit = fit
        self._last: tuple[float, EngineMetrics] | None = None

    def restarted(self) -> None:
        """Its counters started again: the next scrape opens no interval."""
        self._last = None

    def scraped(self, now: float, m: EngineMetrics) -> bool:
        """A scrape at ``now``; whether it closed a busy interval the fit learned from."""
        last, self._last = self._last, (now, m)
        if last is None or m.generation_tokens is None or m.prompt_tokens is None:
            return False
        t0, m0 = last
        if not (m0.running or m0.waiting) or not (m.running or m.waiting):
            return False
        generated = m.generation_tokens - (m0.generation_tokens or 0.0)
        hits = (m.prefix_hits or 0.0) - (m0.prefix_hits or 0.0)
        prefilled = m.prompt_tokens - (m0.prompt_tokens or 0.0) - hits
        batch = max(1.0, (m0.running + m.running) / 2)
        self.fit.observe(now - t0, max(0.0, prefilled), max(0.0, generated), batch)
        return True
