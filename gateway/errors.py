"""The gateway's own errors, and their shape in the calling API's format.

Every failure a client sees is a ``GatewayError``; lower layers translate their own exceptions into one of
these at their boundary (the upstream transport's in ``gateway.upstream.client``, the limiter's in the
pipeline), so no module catches an exception type from two layers below it::

    GatewayError(status, message, error_class)        answered in the caller's API shape
    ├── ClientError                                   4xx: the request itself is wrong or not allowed
    │   ├── BadRequest              400   body, JSON, header or field invalid
    │   ├── AuthError               401   missing, unknown, revoked or expired key
    │   ├── Forbidden               403   model or project not allowed for this key
    │   ├── NotFound                404   unknown path or model
    │   ├── MethodNotAllowed        405   known path, other method
    │   ├── PayloadTooLarge         413   body over the size limit, too many anomalies
    │   └── RateLimited             429   a project limit (``limit`` names it; ``retry_after`` set)
    └── UpstreamError                                 the provider failed; nothing wrong with the request
        ├── UpstreamUnreachable     502   connect refused / DNS / connect timeout, after the retries
        ├── UpstreamDisconnected    502   connection dropped, or a malformed response
        ├── UpstreamTooLarge        502   response headers or body over the gateway's caps
        ├── UpstreamCredentialRejected 502 the provider refused the gateway's own provider key
        ├── UpstreamBadAnswer       502   an answer the gateway cannot use (a 204 or 3xx; summaries)
        └── UpstreamTimeout         504   no byte within the read timeout
    └── StoreUnavailable            503   the key store (database) cannot be reached
    └── LimitsUnavailable           503   Redis down with ``redis_outage: refuse`` (Retry-After set)

An upstream's own error answer (its 4xx/429/5xx body) is not an exception: it is passed on with its status.

Shapes: OpenAI ``{"error": {"message", "type", "param", "code"}}``;
Anthropic ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
from typing import Literal

from aiohttp import web

ApiStyle = Literal["openai", "anthropic"]

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class GatewayError(Exception):
    """A failure answered to the client. ``error_class`` goes to the ledger."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_class: str,
        code: str | None = None,
        retry_after: str | None = None,
        limit: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_class = error_class
        self.code = code
        self.retry_after = retry_after
        self.limit = limit
        self.headers = headers  # extra response headers (e.g. x-should-retry)
        self.close_connection = False  # answer with Connection: close (the request stream is unusable)


class _Fixed(GatewayError):
    """A kind of error with a fixed HTTP status and a default ``error_class``: ``BadRequest("...")``."""

    status_code = 500
    default_class = "internal_error"

    def __init__(self, message: str, *, error_class: str | None = None, **kw) -> None:
        super().__init__(self.status_code, message, error_class=error_class or self.default_class, **kw)


class ClientError(_Fixed):
    """4xx: the request is wrong or not allowed; the gateway logs one line, never a traceback."""

    status_code = 400


class BadRequest(ClientError):
    status_code, default_class = 400, "bad_request"


class AuthError(ClientError):
    status_code, default_class = 401, "auth_invalid"


class Forbidden(ClientError):
    status_code, default_class = 403, "forbidden"


class NotFound(ClientError):
    status_code, default_class = 404, "not_found"


class MethodNotAllowed(ClientError):
    status_code, default_class = 405, "method_not_allowed"


class PayloadTooLarge(ClientError):
    status_code, default_class = 413, "body_too_large"


class RateLimited(ClientError):
    status_code, default_class = 429, "rate_limited"


class UpstreamError(_Fixed):
    """The provider failed (a 5xx to the client); raised by gateway.upstream.client at its boundary."""

    status_code, default_class = 502, "upstream_error"
    # Noted by gateway.upstream on the way out: why the retry loop may retry this failure (a metrics label;
    # None: it must not), the time its attempts waited for a provider slot, the time waited between them
    # (backoff, Retry-After), and the plan's target of the attempt that failed last.
    retry_reason: str | None = None
    slot_wait_s: float = 0.0
    retry_wait_s: float = 0.0
    target: object = None


class UpstreamUnreachable(UpstreamError):
    default_class = "unreachable"


class UpstreamDisconnected(UpstreamError):
    default_class = "upstream_disconnected"


class UpstreamTooLarge(UpstreamError):
    default_class = "upstream_too_large"


class UpstreamCredentialRejected(UpstreamError):
    default_class = "upstream_credential_rejected"


class UpstreamBadAnswer(UpstreamError):
    default_class = "invalid_model_answer"


class UpstreamTimeout(UpstreamError):
    status_code, default_class = 504, "read_timeout"


class LimitsUnavailable(_Fixed):
    """Redis, which holds the shared limits, is down and the config says ``redis_outage: refuse``: raised by
    gateway.limits.redis_project instead of admitting on this process's share."""

    status_code, default_class = 503, "limits_unavailable"


class StoreUnavailable(_Fixed):
    """The gateway's own database could not answer a key lookup, or a read of the ledger: raised by
    gateway.store.keys and gateway.store.ledger_queries at their boundary."""

    status_code, default_class = 503, "store_unavailable"


def error_type(style: ApiStyle, status: int) -> str:
    if style == "anthropic":
        return _ANTHROPIC_TYPES.get(status, "api_error")
    return _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(style: ApiStyle, status: int, message: str, code: str | None = None) -> dict:
    etype = error_type(style, status)
    if style == "anthropic":
        return {"type": "error", "error": {"type": etype, "message": message}}
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


def error_response(
    style: ApiStyle,
    status: int,
    message: str,
    *,
    code: str | None = None,
    retry_after: str | None = None,
    request_id: str | None = None,
    limit: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    headers = dict(headers) if headers else {}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    if request_id is not None:
        headers["x-request-id"] = request_id
    if limit is not None:
        headers["x-farm-limit"] = limit
    return web.Response(
        status=status,
        body=json.dumps(error_body(style, status, message, code)).encode(),
        content_type="application/json",
        headers=headers,
    )


def protocol_error_response(status: int, message: str) -> web.Response:
    """The answer to a request the HTTP server could not parse: its API is unknown, so the body has both
    shapes at once (Anthropic's ``type: error`` with OpenAI's ``param`` and ``code``), which both SDKs
    read."""
    body = {
        "type": "error",
        "error": {"type": error_type("anthropic", status), "message": message, "param": None, "code": None},
    }
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


def sse_error_event(style: ApiStyle, status: int, message: str, *, responses_api: bool = False) -> bytes:
    """The events that end a stream whose status line has already gone to the client.

    Anthropic: an ``error`` event. OpenAI chat: a ``data:`` chunk with ``{"error": ...}`` (the SDK raises
    it). Responses API (Codex): an ``error`` event and then ``response.failed``, both with their ``type``,
    so the client shows the reason instead of "stream closed before response.completed"."""
    body = error_body(style, status, message)
    if style == "anthropic":
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    if not responses_api:
        return b"data: " + json.dumps(body).encode() + b"\n\n"
    code = body["error"]["type"]
    error = {"type": "error", "code": code, "message": message, "param": None}
    failed = {
        "type": "response.failed",
        "response": {
            "object": "response",
            "status": "failed",
            "error": {"code": code, "message": message},
            "incomplete_details": None,
        },
    }
    return (
        b"event: error\ndata: "
        + json.dumps(error).encode()
        + b"\n\nevent: response.failed\ndata: "
        + json.dumps(failed).encode()
        + b"\n\n"
    )


def upstream_error_is_shaped(style: ApiStyle, body: object) -> bool:
    """Whether an upstream error body is already in the client's API shape (so it can pass through)."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    if style == "anthropic":
        return body.get("type") == "error"
    return "message" in body["error"]
