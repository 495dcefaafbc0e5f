"""Reading an OpenAI streaming response as it arrives: whole server-sent events out of network reads,
and what each event means to the timing (a token, the usage, the end, an error).

Kept apart from the client so it is a pure function of the bytes, and testable without a socket.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sagegate.core.sse import Framer, data, events

TOKEN, USAGE, DONE, ERROR, OTHER = "token", "usage", "done", "error", "other"


class EventSplitter:
    """Splits a byte stream into the data of its complete events, read by line (``core.sse``)."""

    __slots__ = ("_framer",)

    def __init__(self, max_event_bytes: int = 1 << 26) -> None:
        self._framer = Framer(max_event_bytes)

    def feed(self, chunk: bytes) -> list[bytes]:
        block = self._framer.feed(chunk)
        if not block:
            return []
        return [d for e in events(block) if (d := data(e)) is not None]


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    usage: dict[str, Any] | None = None
    message: str = ""


_TOKEN = Event(TOKEN)


def classify(payload: bytes, chat: bool) -> Event:
    """What one event payload is. A chunk with a choice is a token, except chat's opening chunk that only
    names the role; a chunk with ``usage`` carries the counts (it may also carry a token)."""
    if payload == b"[DONE]":
        return Event(DONE)
    if (
        b'"choices":[{' in payload
        and b'"usage"' not in payload
        and b'"error"' not in payload
        and not (chat and b'"role"' in payload)
    ):
        return _TOKEN  # the common case, without parsing: a plain token chunk
    try:
        obj = json.loads(payload)
    except ValueError:
        return Event(ERROR, message=f"unparseable event: {payload[:80]!r}")
    if not isinstance(obj, dict):
        return Event(OTHER)
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message", "") if isinstance(err, dict) else str(err)
        return Event(ERROR, message=str(msg)[:200])
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else None
    choices = obj.get("choices") or []
    if choices and _is_token(choices[0], chat):
        return Event(TOKEN, usage=usage)
    return Event(USAGE, usage=usage) if usage is not None else Event(OTHER)


def _is_token(choice: Any, chat: bool) -> bool:
    if not chat or not isinstance(choice, dict):
        return True
    delta = choice.get("delta") or {}
    return not ("role" in delta and not delta.get("content") and choice.get("finish_reason") is None)
