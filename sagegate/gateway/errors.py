"""Errors are values at the edge: every outcome the gateway answers itself is one :class:`GatewayError`,
mapped here, and only here, to an HTTP status, headers and an OpenAI-style body."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.responses import Response

from sagegate.core import sse
from sagegate.core.outcomes import Reason

REASON_HEADER = "x-sagegate-reason"


class GatewayError(Exception):
    """An answer to the client that is not the backend's: status, OpenAI error type, reason code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        reason: str | None = None,
        param: str | None = None,
        retry_after: int | str | None = None,
        close: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.close = close
        """Answer with ``connection: close`` (the request was not read to its end)."""
        self.status = status
        self.message = message
        self.type = type
        self.reason = reason
        self.param = param
        self.retry_after = retry_after
        self.headers = dict(headers or {})
        """Headers the answer must carry (``Allow`` on a 405)."""

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.reason or self.status,
            }
        }

    def response(self) -> Response:
        headers = dict(self.headers)
        if self.reason:
            headers[REASON_HEADER] = self.reason
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        if self.close:
            headers["connection"] = "close"
        return Response(
            json.dumps(self.body()), status_code=self.status, headers=headers, media_type="application/json"
        )


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, reason=Reason.INVALID_REQUEST, param=param)


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body exceeds {limit} bytes", reason=Reason.BODY_TOO_LARGE, close=True)


def unauthorized() -> GatewayError:
    return GatewayError(
        401, "invalid or missing API key", type="authentication_error", reason=Reason.UNAUTHORIZED
    )


def forbidden(message: str, param: str | None = None) -> GatewayError:
    """The client's key does not allow what it asked for."""
    return GatewayError(403, message, type="permission_error", reason=Reason.FORBIDDEN, param=param)


def busy(reason: str, message: str, retry_after: int) -> GatewayError:
    """Backends healthy but full, or the queue full: come back later."""
    return GatewayError(429, message, type="rate_limit_error", reason=reason, retry_after=retry_after)


def unavailable(reason: str, message: str, retry_after: int | None = None) -> GatewayError:
    return GatewayError(503, message, type="service_unavailable", reason=reason, retry_after=retry_after)


def rate_limited(message: str, retry_after: str | None) -> GatewayError:
    """Every backend that could take the request said 429: passed on, with the backend's Retry-After."""
    return GatewayError(
        429, message, type="rate_limit_error", reason=Reason.UPSTREAM_RATE_LIMITED, retry_after=retry_after
    )


def limit_exceeded(message: str, retry_after_s: int | None) -> GatewayError:
    """The tenant is over one of its rate limits (OpenAI's shape: ``rate_limit_exceeded``; no
    ``Retry-After`` when no wait would help)."""
    return GatewayError(
        429, message, type="rate_limit_error", reason=Reason.RATE_LIMIT_EXCEEDED, retry_after=retry_after_s
    )


def timeout(message: str) -> GatewayError:
    return GatewayError(408, message, reason=Reason.REQUEST_TIMEOUT, close=True)


def upstream_failed(message: str, reason: str = Reason.UPSTREAM_FAILED) -> GatewayError:
    return GatewayError(502, message, type="upstream_error", reason=reason)


def sse_error_event(message: str, code: str = Reason.UPSTREAM_FAILED, type: str = "upstream_error") -> bytes:
    """The event sent when a stream breaks after it started: an OpenAI error object as SSE data."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return sse.frame(json.dumps(body).encode())
