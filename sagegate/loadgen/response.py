"""A request's record from "not sent" to its outcome: what the answer means for it (the gateway's
headers, a refusal or an HTTP error, and for a streamed answer the token times, the usage and how the
stream ended).

Kept apart from the send loop so the rules that class an outcome (ok, rejected, error of which kind)
read in one place.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from sagegate.core.record import RequestRecord
from sagegate.core.request import TraceRequest
from sagegate.loadgen.sse import DONE, ERROR, TOKEN, EventSplitter, classify


@dataclass(slots=True)
class StreamEnd:
    """What an SSE stream said besides its tokens: the usage it reported, whether it sent ``[DONE]``,
    and the error message it carried (empty: none)."""

    usage: dict[str, Any] | None = None
    done: bool = False
    error: str = ""


def unsent(req: TraceRequest) -> RequestRecord:
    """A request's record before it is sent: cancelled, so a replay stopped early accounts for it."""
    return RequestRecord(
        rid=req.rid,
        arrival_s=req.arrival_s,
        prompt_tokens=req.prompt_tokens,
        output_tokens=0,
        status="cancelled",
        reason="not sent",
        tenant=req.tenant,
        deadline_s=req.deadline_s,
    )


def fail(rec: RequestRecord, kind: str, message: str) -> None:
    rec.status, rec.error_kind, rec.reason = "error", kind, message[:200]


def read_headers(
    rec: RequestRecord, headers: httpx.Headers, predicted_header: str, backend_header: str
) -> None:
    """The gateway's prediction and the backend it chose, when it says."""
    pred = headers.get(predicted_header)
    if pred is not None:
        with contextlib.suppress(ValueError):
            rec.predicted_mean = float(pred)
    rec.backend = headers.get(backend_header, rec.backend)


def http_failure(rec: RequestRecord, status: int, headers: httpx.Headers, body: bytes) -> None:
    """A non-200 answer: ``rejected`` when the server turned the request away (429, or a 503 naming a
    reason), else an error of kind ``http_<status>``."""
    message = body[:200].decode(errors="replace")
    try:
        err = json.loads(body).get("error")
        message = str(err.get("message", message) if isinstance(err, dict) else err)[:200]
    except (ValueError, AttributeError):
        pass
    reason = headers.get("x-sagegate-reason")
    if status == 429 or (status == 503 and reason):
        rec.status, rec.error_kind, rec.reason = "rejected", reason or f"http_{status}", message
    else:
        fail(rec, f"http_{status}", message)


async def read_stream(
    resp: httpx.Response, times: list[float], now: Callable[[], float], chat: bool
) -> StreamEnd:
    """Read an SSE answer to its end, appending each token chunk's arrival time (``now()``) to ``times``."""
    splitter = EventSplitter()
    end = StreamEnd()
    async for chunk in resp.aiter_bytes():
        t = now()
        for payload in splitter.feed(chunk):
            ev = classify(payload, chat)
            if ev.kind == TOKEN:
                times.append(t)
            elif ev.kind == DONE:
                end.done = True
            elif ev.kind == ERROR:
                end.error = ev.message
            if ev.usage is not None:
                end.usage = ev.usage
    return end


def finish(rec: RequestRecord, end: StreamEnd) -> None:
    """Settle a streamed request's record: its lengths (the usage's, else the chunks counted), first and
    last token times, and its outcome."""
    times = rec.chunk_times
    rec.output_tokens = len(times)
    usage = end.usage
    if usage is not None:
        rec.output_tokens = int(usage.get("completion_tokens") or rec.output_tokens)
        rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens"):
            rec.cached_tokens = int(details["cached_tokens"])
    if times:
        rec.first_token_s, rec.finish_s = times[0], times[-1]
    if end.error:
        fail(rec, "stream_error", end.error)
    elif not end.done:
        fail(rec, "incomplete", "the stream ended without [DONE]")
    elif not times:
        fail(rec, "no_tokens", "the stream carried no token")
    else:
        rec.status, rec.error_kind, rec.reason = "ok", "", ""
