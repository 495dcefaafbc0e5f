"""The replay's live progress bar (rich, on stderr): completed requests, throughput, recent TTFT."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sized
from typing import Protocol


class LiveFigures(Protocol):
    """What a running replay keeps up to date for the bar."""

    finished: int
    ok: int
    failed: int
    tokens: int

    @property
    def recent_ttft(self) -> Collection[float]: ...

    @property
    def records(self) -> Sized: ...

    def now(self) -> float: ...


class ProgressView:
    """A rich progress bar with live throughput and latency, refreshed a few times a second."""

    def __init__(self, run: LiveFigures) -> None:
        self.run_ = run

    def line(self) -> str:
        r = self.run_
        now = max(r.now(), 1e-9)
        ttfts = sorted(r.recent_ttft)
        p50 = f"{ttfts[len(ttfts) // 2] * 1000:.0f} ms" if ttfts else "-"
        return (
            f"{r.tokens / now:,.0f} tok/s · {r.ok / now:.1f} req/s · TTFT p50 {p50} (last 200) · "
            f"errors {r.failed}"
        )

    async def run(self, stop: asyncio.Event) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        r = self.run_
        with Progress(
            TextColumn("replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
        ) as bar:
            task = bar.add_task("", total=len(r.records))
            while not stop.is_set():
                bar.update(task, completed=r.finished, description=self.line())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            bar.update(task, completed=r.finished, description=self.line())
