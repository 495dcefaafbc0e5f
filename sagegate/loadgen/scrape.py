"""Reading a server's Prometheus ``/metrics``: a gauge's or a counter's value, a gauge polled through a
run, and the backends' preemption counters, which only the backends can report (a client never sees a
preemption).

One reader for every caller (the replay, the demo, the benchmarks), so they all count the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

PREEMPTIONS = "vllm:num_preemptions"
"""vLLM's counter of requests preempted (by recompute), which ``sagegate backend`` also exposes."""


def gauge_value(text: str, name: str) -> float | None:
    """The sum over label sets of gauge ``name`` in a Prometheus exposition, None when absent."""
    return gauge_values(text, [name])[name]


def gauge_values(text: str, names: Sequence[str]) -> dict[str, float | None]:
    """:func:`gauge_value` of each of ``names`` (sample names), the exposition parsed once."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[float]] = {name: [] for name in names}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in values:
                values[s.name].append(s.value)
    return {name: float(sum(v)) if v else None for name, v in values.items()}


@dataclass(slots=True)
class GaugeSamples:
    """A gauge's ``(time, value)`` readings over a run, and the polls that got no value."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    failures: int = 0


async def poll_gauge(
    url: str,
    name: str,
    into: GaugeSamples,
    *,
    now: Callable[[], float],
    stop: asyncio.Event,
    interval_s: float,
    headers: dict[str, str],
) -> None:
    """Read gauge ``name`` from ``url`` into ``into`` every ``interval_s`` (at time ``now()``) until
    ``stop`` is set."""
    async with httpx.AsyncClient(timeout=2.0, headers=headers) as client:
        while not stop.is_set():
            t = now()
            try:
                resp = await client.get(url)
                value = gauge_value(resp.text, name) if resp.status_code == 200 else None
                if value is None:
                    into.failures += 1
                else:
                    into.samples.append((t, value))
            except (httpx.HTTPError, ValueError):
                into.failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)


def counter_total(text: str, name: str) -> float | None:
    """The sum over label sets of counter ``name`` (its ``_total`` samples), None when absent."""
    return counter_totals(text, [name])[name]


def counter_totals(text: str, names: Sequence[str]) -> dict[str, float | None]:
    """:func:`counter_total` of each of ``names``, the exposition parsed once."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[float]] = {name: [] for name in names}
    for fam in text_string_to_metric_families(text):
        if fam.name in values:
            values[fam.name] += [s.value for s in fam.samples if s.name == fam.name + "_total"]
    return {name: float(sum(v)) if v else None for name, v in values.items()}


def counter_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Counter ``name``'s ``_total`` by the value of ``label`` (label sets sharing it summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            for s in fam.samples:
                if s.name == name + "_total" and label in s.labels:
                    out[s.labels[label]] = out.get(s.labels[label], 0.0) + float(s.value)
    return out


async def read_counters(
    client: httpx.AsyncClient, urls: Sequence[str], names: Sequence[str]
) -> dict[str, float | None]:
    """Each counter of ``names`` summed over the ``/metrics`` ``urls``; None for a counter that any of
    them does not report (unreachable, not 200, unparsable or absent). Stops early once every counter
    is None."""
    totals: dict[str, float | None] = dict.fromkeys(names, 0.0)
    for url in urls:
        try:
            resp = await client.get(url, timeout=10.0)
            found = counter_totals(resp.text, names) if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            found = {}
        for name in names:
            value, total = found.get(name), totals[name]
            totals[name] = None if value is None or total is None else total + value
        if all(v is None for v in totals.values()):
            break
    return totals


async def read_preemptions(client: httpx.AsyncClient, urls: Sequence[str]) -> float | None:
    """``vllm:num_preemptions`` summed over the ``/metrics`` ``urls``; None when any of them does not say."""
    return (await read_counters(client, urls, [PREEMPTIONS]))[PREEMPTIONS]


def scrape_counters(urls: Sequence[str], names: Sequence[str]) -> dict[str, float | None]:
    """:func:`read_counters` from synchronous code, on its own client (no proxy from the environment)."""

    async def read() -> dict[str, float | None]:
        async with httpx.AsyncClient(trust_env=False) as client:
            return await read_counters(client, urls, names)

    return asyncio.run(read())


def scrape_preemptions(urls: Sequence[str]) -> float | None:
    """:func:`read_preemptions` from synchronous code."""
    return scrape_counters(urls, [PREEMPTIONS])[PREEMPTIONS]
