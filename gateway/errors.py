"""Errors in the calling API's own shape.

OpenAI: ``{"error": {"message", "type", "code"}}``;
Anthropic: ``{"type": "error", "error": {"type", "message"}}``.
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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_class = error_class
        self.code = code
        self.retry_after = retry_after
        self.limit = limit


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
) -> web.Response:
    headers = {}
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


def sse_error_event(style: ApiStyle, status: int, message: str) -> bytes:
    """An error event for a stream whose status line has already gone to the client."""
    body = error_body(style, status, message)
    if style == "anthropic":
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def upstream_error_is_shaped(style: ApiStyle, body: object) -> bool:
    """Whether an upstream error body is already in the client's API shape (so it can pass through)."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    if style == "anthropic":
        return body.get("type") == "error"
    return "message" in body["error"]
