"""The project's own JSON-lines workload: one object per line with ``arrival_s``, ``prompt_tokens`` and
``output_tokens``, optionally ``prompt``, ``tenant``, ``priority``, ``deadline_s`` (absolute, same clock as
``arrival_s``) and ``hash_ids``; any other key is kept in ``extra``. It is the format to write when
converting a trace no other reader knows.
"""

from __future__ import annotations

from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers.common import (
    ReadStats,
    collect_requests,
    iter_json_lines,
    json_seconds,
    json_tokens,
    require_keys,
)
from sagegate.loadgen.readers.mooncake import hash_id_tuple

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("prompt", "tenant", "priority", "deadline_s", "hash_ids")


def _parse(obj: dict[str, object]) -> TraceRequest:
    require_keys(obj, REQUIRED)
    arrival = json_seconds(obj["arrival_s"], "arrival_s")
    prompt_tokens = json_tokens(obj["prompt_tokens"], "prompt_tokens")
    output_tokens = json_tokens(obj["output_tokens"], "output_tokens")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    tenant = obj.get("tenant", "default")
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant must be a non-empty string, got {tenant!r}")
    priority = obj.get("priority", 1)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    deadline = obj.get("deadline_s")
    if deadline is not None:
        deadline = json_seconds(deadline, "deadline_s")
        if deadline < arrival:
            raise ValueError(f"deadline_s {deadline} is before arrival_s {arrival}")
    hashes = obj.get("hash_ids")
    return TraceRequest(
        arrival_s=arrival,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        prompt=prompt,
        tenant=tenant,
        priority=priority,
        deadline_s=deadline,
        hash_ids=None if hashes is None else hash_id_tuple(hashes),
        extra={k: v for k, v in obj.items() if k not in REQUIRED and k not in OPTIONAL},
    )


def read(path: Path, stats: ReadStats, *, limit: int | None = None) -> list[TraceRequest]:
    """Requests in file order (the first ``limit`` valid lines), not rebased."""
    return collect_requests(path, stats, iter_json_lines(path), _parse, limit=limit)
