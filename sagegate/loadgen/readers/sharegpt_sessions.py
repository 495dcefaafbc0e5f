"""ShareGPT multi-turn conversations as sessions: gzip JSON lines ``{"id", "turns": [{"role", "text"}]}``.

Each conversation is a session; its k-th request is the k-th user turn with the whole history before
it (the earlier user turns and the real assistant replies), so turn k+1's prompt extends turn k's
block for block, as a chat client re-sends it: real prefix reuse. The output is the real reply's
length. The text is the history rendered as ``role: text`` lines (``core.tokens.flatten_messages``, what
the gateway and the simulated backend render); ``extra["messages"]`` keeps the messages for a chat
replay and ``extra["session"]`` the conversation's id.

Sessions start on an arrival process (``rate`` sessions a second, Poisson or gamma with ``cv``; or
``arrivals_from``, another trace's times); a session's next turn comes when its previous reply would
have been read: ``decode_s_per_token`` × the reply's length, plus a think time drawn from an
exponential of mean ``think_s``. Times are open-loop (a replay does not wait for the reply).

``exclude``: first-turn prompt digests (``core.request.prompt_digest``) whose conversations are left
out (those a shipped predictor part learned from).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sagegate.core.request import TraceRequest, prompt_digest
from sagegate.core.tokens import count_tokens, flatten_messages
from sagegate.loadgen.readers.common import ReadStats, attach_times, check_clock, iter_json_lines

ROLES = {"user", "assistant", "system"}


def _conversation(obj: dict[str, object]) -> tuple[str, list[dict[str, str]]] | None:
    """The conversation's id and messages, or None if it is not a usable one (no user turn answered)."""
    turns = obj.get("turns")
    if not isinstance(turns, list):
        raise ValueError("a conversation needs a 'turns' list")
    messages = []
    for t in turns:
        if not isinstance(t, dict) or t.get("role") not in ROLES or not isinstance(t.get("text"), str):
            raise ValueError(f"each turn needs a role in {sorted(ROLES)} and a text")
        messages.append({"role": str(t["role"]), "content": str(t["text"])})
    if not any(m["role"] == "user" for m in messages):
        return None
    return str(obj.get("id", "")), messages


def session_requests(sid: str, messages: list[dict[str, str]], start_s: float, think: Sequence[float],
                     decode_s_per_token: float) -> list[TraceRequest]:  # fmt: skip
    """One request per user turn that the conversation answers: its history, the reply's length."""
    out: list[TraceRequest] = []
    tokens = [count_tokens(m["content"]) + 3 for m in messages]  # ``role: text`` and the newline
    t = start_s
    for k, m in enumerate(messages):
        if m["role"] != "user" or k + 1 >= len(messages) or messages[k + 1]["role"] != "assistant":
            continue
        reply = tokens[k + 1] - 3
        if reply < 1:
            continue
        history = messages[: k + 1]
        extra: dict[str, Any] = {"session": sid, "turn": len(out), "messages": history}
        out.append(
            TraceRequest(t, sum(tokens[: k + 1]), reply, prompt=flatten_messages(history), extra=extra)
        )
        t += reply * decode_s_per_token + think[len(out) % len(think)]
    return out


def read(
    path: Path,
    stats: ReadStats,
    *,
    limit: int | None = None,
    seed: int = 0,
    rate: float | None = None,
    arrivals_from: Sequence[float] | None = None,
    arrival: str = "poisson",
    cv: float = 1.0,
    sessions: int | None = None,
    think_s: float = 10.0,
    decode_s_per_token: float = 0.02,
    exclude: frozenset[int] = frozenset(),
) -> list[TraceRequest]:
    """The sessions' requests by arrival (the first ``limit``), not rebased. ``sessions`` caps the
    conversations read (default: as many as ``arrivals_from`` has times, else all)."""
    import numpy as np

    check_clock(arrivals_from, rate, "sessions")
    if think_s < 0 or decode_s_per_token < 0:
        raise ValueError("think_s and decode_s_per_token must be >= 0")
    cap = sessions if arrivals_from is None else min(sessions or len(arrivals_from), len(arrivals_from))
    convs: list[tuple[str, list[dict[str, str]]]] = []
    for _, obj in iter_json_lines(path):
        stats.rows += 1
        conv = _conversation(obj)
        first_user = next((m["content"] for m in conv[1] if m["role"] == "user"), "") if conv else ""
        if conv is None or (exclude and prompt_digest(first_user) in exclude):
            continue
        convs.append(conv)
        if cap is not None and len(convs) >= cap:
            break
    rng = np.random.default_rng(seed)
    starts = attach_times(len(convs), arrivals_from=arrivals_from, rate=rate, arrival=arrival, cv=cv, rng=rng)
    requests: list[TraceRequest] = []
    for (sid, messages), start in zip(convs, starts, strict=True):
        think = rng.exponential(think_s, size=64).tolist() if think_s > 0 else [0.0]
        requests.extend(session_requests(sid, messages, start, think, decode_s_per_token))
    requests.sort(key=lambda r: r.arrival_s)
    return requests[:limit] if limit is not None else requests
