"""The words for how a request ended, shared by the gateway (metric labels, the ``x-sagegate-reason``
header), the load generator (which reads that header into a record) and the predictor (its paths).

The values are the strings clients and dashboards read: never change one, only add.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A request's end in a :class:`core.record.RequestRecord` (``status``)."""

    OK = "ok"
    REJECTED = "rejected"
    ERROR = "error"
    CANCELLED = "cancelled"


class Reason(StrEnum):
    """Why the gateway answered a request itself: the reason header, the error body's ``code`` and
    the ``sagegate_rejections_total{reason}`` label. A policy's own screening reason (a plain string
    from ``policies``) travels the same way."""

    # refused before, or while, waiting in the queue
    DRAINING = "draining"
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    QUEUE_FULL = "queue_full"
    QUEUE_FULL_REQUESTS = "queue_full_requests"
    QUEUE_FULL_TOKENS = "queue_full_tokens"
    QUEUE_TIMEOUT = "queue_timeout"
    REJECTED_BY_POLICY = "rejected_by_policy"
    # every backend tried failed
    UPSTREAM_RATE_LIMITED = "upstream_rate_limited"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    """The tenant is over one of its ``rate_limits``."""
    UPSTREAM_FAILED = "upstream_failed"
    REQUEST_FAILED_TWICE = "request_failed_twice"
    """The same request failed on two backends: taken as the request's fault (``gateway.blame``)."""
    INPUT_REFUSED = "input_refused"
    """... and a backend's error said the input was refused (a 400)."""
    RETRY_BUDGET_SPENT = "retry_budget_spent"
    """A try failed in a way the request may have caused and its tenant's retry budget is spent."""
    # the client's request
    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    MODEL_NOT_FOUND = "model_not_found"
    REQUEST_TIMEOUT = "request_timeout"
    REQUEST_HEADER_TOO_LARGE = "request_header_too_large"
    HTTP_ERROR = "http_error"
    # the operator's pause (``POST /admin/requests/{id}/pause``)
    NOT_FOUND = "not_found"
    PAUSE_DISABLED = "pause_disabled"
    NOT_PAUSABLE = "not_pausable"
    # the gateway's own fault
    INTERNAL_ERROR = "internal_error"


class Outcome(StrEnum):
    """How a request the gateway let through ended: ``sagegate_requests_total{status}`` (a refusal is
    counted there by its HTTP status code instead)."""

    OK = "ok"
    CLIENT_ERROR = "client_error"
    """The backend answered with its own client error (a 4xx other than 429)."""
    TRUNCATED = "truncated"
    """The stream ended without its ``[DONE]``."""
    FAILED = "failed"
    CANCELLED = "cancelled"
    SLOW_CLIENT = "slow_client"
    SHUTDOWN = "shutdown"
    ERROR = "error"
    """The gateway's own bug."""
    CLIENT_GONE = "client_gone"


class CancelStage(StrEnum):
    """Where a request was when its client went away: ``sagegate_cancellations_total{stage}``."""

    UPLOAD = "upload"
    QUEUED = "queued"
    UPSTREAM = "upstream"
    STREAMING = "streaming"
    SLOW_CLIENT = "slow_client"


class PredictionPath(StrEnum):
    """Which way a length prediction was made: ``sagegate_predictor_path_total{path}`` and the admin
    queue's ``predictor_path``. A baseline predictor's path is its name."""

    NONE = "none"
    ERROR = "error"
    """The predictor raised: the request goes on without a prediction."""
    LATE = "late"
    """The embedding missed its budget: ranked from the prompt-length prior until the prediction
    comes (:class:`LateOutcome`)."""
    NO_TEXT = "no_text"
    """The prompt has no text to read (token ids): ranked from the prompt-length prior, which alone
    learns from its outcome."""
    SEMANTIC = "semantic"
    BUCKET = "bucket"
    GLOBAL = "global"
    PREFIX = "prefix"
    COLD = "cold"
    LENGTH_BUCKET = "length-bucket"


class LateOutcome(StrEnum):
    """What became of a prediction that missed its budget (path ``late``) when it came:
    ``sagegate_late_predictions_total{outcome}``."""

    RERANKED = "reranked"
    """The request still waited in the gateway's queue: it was ranked again by the prediction."""
    DISPATCHED = "dispatched"
    """The request had left the queue (dispatched, or ended): it ran on the prior's rank."""
    REBASED = "rebased"
    """The request had been sent (nothing waited ahead of it, ``dispatch_first``) and still ran:
    its admission charge was recomputed from the prediction."""
    FAILED = "failed"
    """The embedding failed: the prior's rank stood."""
