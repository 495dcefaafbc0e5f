"""Request identity and the access log: one line per request an operator can find by its id.

A request's id is the client's ``x-request-id`` when it is a sane one (1–128 visible ASCII
characters), else one the gateway makes; it is returned on every answer (errors included), sent
upstream as vLLM reads it (``x-request-id``; a later try of the same request, a retry or a resume,
as ``{id}.{n}`` so an engine still aborting the first never sees the id twice), and written on the
request's one access-log line. The line never holds the prompt (``log_prompts`` logs it apart).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any, Literal

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128
_SANE = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")

AccessLogFormat = Literal["off", "text", "json"]

log = logging.getLogger("sagegate.access")


def request_id(headers: Mapping[str, str]) -> str:
    """The client's ``x-request-id`` when sane, else a new one (a client's bad id is replaced, not
    refused: the id is for tracing, and a request must not fail for it)."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is not None and _SANE.fullmatch(given):
        return given
    return uuid.uuid4().hex


def upstream_id(rid: str, tries: int) -> str:
    """The id a backend sees on a request's ``tries``-th try after the first (0: the client's id)."""
    return rid if tries == 0 else f"{rid}.{tries}"


class AccessLog:
    """Writes each request's line to the ``sagegate.access`` logger (``text``: ``key=value`` pairs;
    ``json``: one object), or nothing (``off``)."""

    def __init__(self, fmt: AccessLogFormat = "text") -> None:
        self.fmt = fmt

    def write(self, fields: Mapping[str, Any]) -> None:
        if self.fmt == "off" or not log.isEnabledFor(logging.INFO):
            return
        present = {k: _rounded(v) for k, v in fields.items() if v is not None}
        if self.fmt == "json":
            log.info(json.dumps(present, separators=(",", ":")))
        else:
            log.info(" ".join(f"{k}={_text(v)}" for k, v in present.items()))


def _rounded(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def _text(v: Any) -> str:
    s = str(v)
    return json.dumps(s) if (not s or any(c in s for c in ' "=')) else s


def access_fields(
    req: Any, status: int, outcome: str, now: float, backend: str | None = None, output: int | None = None
) -> dict[str, Any]:
    """A request's line (``req``: its ``gateway.queue.GatewayRequest``): who, where, what came of it,
    its tokens and its times in seconds from its arrival."""
    pred = req.prediction
    return {
        "id": req.request_id,
        "tenant": req.tenant,
        "model": req.model,
        "route": str(req.route),
        "backend": backend,
        "status": status,
        "outcome": outcome,
        "prompt_tokens": req.prompt_tokens,
        "cached_tokens": req.predicted_cached if backend is not None else None,
        "output_tokens": output,
        "predicted_tokens": None if pred is None else round(pred.mean),
        "prediction_path": req.prediction_path,
        "queue_s": None if req.t_dispatch is None else req.t_dispatch - req.arrival_s,
        "ttft_s": None if req.t_first is None else req.t_first - req.arrival_s,
        "ttlt_s": now - req.arrival_s,
        "retries": req.attempt,
        "resumes": req.pauses,
    }
