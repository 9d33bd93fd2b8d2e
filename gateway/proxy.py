"""The four proxy endpoints: chat completions, Responses, Messages and count_tokens.

Each request goes through the pipeline (gateway.pipeline): authenticate, read and check the body, route the
public model to its provider, admit, send, then relay the answer (whole or as a stream) while counting its
tokens. Bodies pass through untouched except the model id and, for chat streams, ``stream_options``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import (
    ApiStyle,
    BadRequest,
    Forbidden,
    GatewayError,
    NotFound,
    UpstreamError,
    UpstreamTimeout,
    error_response,
    sse_error_event,
    upstream_error_is_shaped,
)
from gateway.pipeline import Pipeline, Record, dump_json, header, parse_json_object, read_body
from gateway.routing import Deployment, RoutePlan
from gateway.upstream import UpstreamResult, client_retry_after
from gateway.usage import Api, StreamUsage, estimate_output_tokens, estimate_tokens, usage_details

if TYPE_CHECKING:
    from gateway.app import Gateway

FORWARD_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta", "accept")
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
SUMMARIES_HINT = "/v1/farm/summaries"
# After the gateway has retried, the client must not retry again on top (both SDKs honour this header):
# one client call then costs at most max_retries + 1 upstream attempts.
NO_CLIENT_RETRY = {"x-should-retry": "false"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # chat | responses | messages | count_tokens
    style: ApiStyle
    path: str  # appended to the provider's base_url
    usage_api: Api | None  # None: the request consumes no tokens


CHAT = Endpoint("chat", "openai", "/chat/completions", "chat")
RESPONSES = Endpoint("responses", "openai", "/responses", "responses")
MESSAGES = Endpoint("messages", "anthropic", "/messages", "messages")
COUNT_TOKENS = Endpoint("count_tokens", "anthropic", "/messages/count_tokens", None)
ENDPOINTS = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
}


class RequestHead(BaseModel):
    """The few request fields the gateway reads; the rest passes through untouched."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)

    def token_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_output_tokens or self.max_tokens


def forward_headers(request: web.Request, ep: Endpoint) -> dict[str, str]:
    """The client headers the upstream needs. Their values must be printable ASCII: anything else would
    either fail to encode on the way out or smuggle bytes through, so it is a 400 naming the header."""
    headers = {"Content-Type": "application/json"}
    for name in FORWARD_HEADERS:
        value = request.headers.get(name)
        if not value:
            continue
        if not (value.isascii() and value.isprintable()):
            raise BadRequest(f"header {name}: the value must be printable ASCII", error_class="bad_header")
        headers[name] = value
    if ep.style == "anthropic" and "anthropic-version" not in headers:
        headers["anthropic-version"] = DEFAULT_ANTHROPIC_VERSION
    return headers


class Proxy:
    def __init__(self, gw: Gateway, pipeline: Pipeline) -> None:
        self.gw = gw
        self.pipeline = pipeline

    def route(self, ep: Endpoint):
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.pipeline.serve(
                request, ep.name, ep.style, lambda req, rec: self._handle(req, rec, ep)
            )

        return handle

    async def _handle(self, request: web.Request, rec: Record, ep: Endpoint) -> web.StreamResponse:
        pipeline = self.pipeline
        _info, project = await pipeline.authenticate(request, rec)
        rec.tag(project, header(request, "X-Farm-Task"))
        rec.session_id = header(request, "X-Claude-Code-Session-Id") or header(request, "session-id")
        headers = forward_headers(request, ep)

        raw = await read_body(request)
        body = parse_json_object(raw)
        try:
            head = RequestHead.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise BadRequest(f"invalid request body: {field}: {err['msg']}") from None
        rec.public_model, rec.stream = head.model, head.stream

        router = self.gw.router
        models = router.models.get(head.model) if router is not None else None
        if models is None:
            raise NotFound(
                f"model {head.model!r} does not exist", error_class="model_unknown", code="model_not_found"
            )
        if head.model not in project.models:
            raise Forbidden(
                f"project {rec.project!r} is not allowed to use model {head.model!r}",
                error_class="model_forbidden",
                code="model_not_allowed",
            )
        rec.model_label = head.model
        if models.kind == "local":  # the offline drafter serves the summaries endpoint only
            raise BadRequest(
                f"model {head.model!r} is the offline drafter: call it through {SUMMARIES_HINT}",
                error_class="wrong_endpoint",
            )
        if (models.kind == "anthropic") != (ep.style == "anthropic"):
            raise BadRequest(
                f"model {head.model!r} is served by a {models.kind} provider and cannot be called "
                f"through this endpoint",
                error_class="wrong_endpoint",
            )

        strip_usage = False
        if ep is CHAT and head.stream:
            opts = body.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage")):
                body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
                strip_usage = True
        bodies: dict[str, bytes] = {}
        if not strip_usage:
            bodies[head.model] = raw  # sent as it came when the upstream id is the public one

        def prepare(target: Deployment) -> bytes:
            """The body for one attempt's target: its upstream model id (encoded once per id)."""
            out = bodies.get(target.upstream_model)
            if out is None:
                body["model"] = target.upstream_model
                out = bodies[target.upstream_model] = dump_json(body)
            return out

        input_estimate = estimate_tokens(raw)
        cap = head.token_cap()
        tokens = input_estimate + (cap or 0) if ep.usage_api is not None else 0  # for deployments' tpm
        plan = router.plan(head.model, project, tokens=tokens, prepare=prepare)

        if ep.usage_api is None:  # count_tokens: no tokens consumed, no limits
            try:
                result = await pipeline.send(rec, plan, ep.path, raw, headers)  # type: ignore[arg-type]
            finally:
                self._note_target(rec, plan)
            if result.status >= 400:
                return self._upstream_error(result, ep, rec)
            return self._with_route(result, await self._respond_whole(request, result, ep, rec, raw))

        admission = await pipeline.admit(rec, cap, input_estimate)
        try:
            try:
                result = await pipeline.send(rec, plan, ep.path, raw, headers)  # type: ignore[arg-type]
            finally:
                self._note_target(rec, plan)
            if result.status >= 400:
                return self._upstream_error(result, ep, rec)
            if head.stream:
                return await self._respond_stream(request, result, ep, rec, raw, strip_usage)
            return self._with_route(result, await self._respond_whole(request, result, ep, rec, raw))
        except GatewayError as e:
            extra = self._route_headers(plan.target)
            if rec.retries:
                extra.update(NO_CLIENT_RETRY)
            if e.headers is None:
                e.headers = extra
            raise
        finally:
            admission.release()
            admission.settle(rec.input_tokens + rec.output_tokens)
            plan.settle(rec.input_tokens + rec.output_tokens)

    @staticmethod
    def _note_target(rec: Record, plan: RoutePlan) -> None:
        """The ledger's view of where the request went: the final attempt's deployment."""
        target = plan.target
        if target is not None:
            rec.deployment, rec.provider = target.name, target.provider
            rec.upstream_model = target.upstream_model
            if plan.fallback_from is not None:
                rec.fallback_from = plan.fallback_from

    @staticmethod
    def _route_headers(target: Deployment | None) -> dict[str, str]:
        """``x-farm-model`` (the public model that answered: a fallback's when one did) and
        ``x-farm-deployment`` (its deployment)."""
        if target is None:
            return {}
        return {"x-farm-model": target.model, "x-farm-deployment": target.name}

    def _with_route(self, result: UpstreamResult, resp: web.Response) -> web.Response:
        resp.headers.update(self._route_headers(result.target))
        return resp

    def _upstream_error(self, result: UpstreamResult, ep: Endpoint, rec: Record) -> web.Response:
        """An upstream's own error answer, passed on with its status (never its 401/403: those refused
        the gateway's provider key, not the client's)."""
        rec.upstream_end = time.perf_counter()
        status = result.status
        rec.status, rec.http_status, rec.error_class = "error", status, f"upstream_{status}"
        extra = self._route_headers(result.target)
        if rec.retries:
            extra.update(NO_CLIENT_RETRY)
        if status in (401, 403):
            rec.http_status = 502
            self.pipeline.gw.log_credential_refused(rec.provider, status)
            return error_response(
                ep.style,
                502,
                f"upstream {rec.provider!r} rejected the gateway's provider credential (HTTP {status}); "
                "this is a gateway configuration problem, not your API key: tell the gateway operator",
                code="upstream_credential_rejected",
                request_id=rec.request_id,
                headers=extra,
            )
        headers = {"x-request-id": rec.request_id, **extra}
        retry_after = client_retry_after(result.headers)
        if retry_after:
            headers["Retry-After"] = retry_after
        body = result.body or b""
        try:
            parsed = parse_json_object(body)
        except GatewayError:
            parsed = None
        if upstream_error_is_shaped(ep.style, parsed):
            return web.Response(status=status, body=body, content_type="application/json", headers=headers)
        detail = body[:500].decode("utf-8", "replace").strip()
        message = f"upstream {rec.provider!r} returned HTTP {status}" + (f": {detail}" if detail else "")
        return error_response(
            ep.style, status, message, retry_after=retry_after, request_id=rec.request_id, headers=extra
        )

    async def _respond_whole(
        self, request: web.Request, result: UpstreamResult, ep: Endpoint, rec: Record, raw: bytes
    ) -> web.Response:
        upstream = result.response
        try:
            data = await upstream.read()
        finally:
            upstream.release()
            rec.upstream_end = time.perf_counter()
        if ep.usage_api is not None:
            try:
                parsed = parse_json_object(data)
            except GatewayError:
                parsed = None
            usage = usage_details(ep.usage_api, parsed)
            if usage is not None:
                rec.input_tokens, rec.output_tokens, rec.cached_input_tokens, rec.cache_write_tokens = usage
            else:
                rec.input_tokens, rec.output_tokens = estimate_tokens(raw), estimate_output_tokens(data)
                rec.estimated = True
        rec.status, rec.http_status = "ok", result.status
        headers = {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "x-request-id": rec.request_id,
        }
        # The row is spooled before the answer leaves: a client that got it always has its row.
        self.pipeline.account(rec)
        return web.Response(status=result.status, body=data, headers=headers)

    async def _respond_stream(
        self,
        request: web.Request,
        result: UpstreamResult,
        ep: Endpoint,
        rec: Record,
        raw: bytes,
        strip_usage: bool,
    ) -> web.StreamResponse:
        upstream = result.response
        tracker = StreamUsage(ep.usage_api, strip_usage)
        responses_api = ep is RESPONSES
        clean_end = False
        try:
            # Nothing has gone to the client yet: a failure here is still a clean error answer.
            first = b""
            while not first:
                chunk = await upstream.readany()
                if not chunk:
                    first = tracker.finish()
                    break
                first = tracker.feed(chunk)

            out = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": upstream.headers.get("Content-Type", "text/event-stream"),
                    "Cache-Control": "no-cache",
                    "x-request-id": rec.request_id,
                    **self._route_headers(result.target),
                },
            )
            try:
                await out.prepare(request)
                rec.http_status = 200
                if first:
                    await out.write(first)
                    rec.ttft = time.perf_counter() - rec.t0
                while True:
                    try:
                        chunk = await upstream.readany()
                    except UpstreamError as e:
                        rec.status, rec.error_class = "error", e.error_class
                        self._count_tokens(rec, tracker, raw)
                        self.pipeline.account(rec)
                        how = (
                            "stalled mid-stream" if isinstance(e, UpstreamTimeout) else "broke off the stream"
                        )
                        msg = f"upstream {rec.provider!r} {how}: {e.message}"
                        await out.write(sse_error_event(ep.style, e.status, msg, responses_api=responses_api))
                        break
                    if not chunk:
                        tail = tracker.finish()
                        rec.status = "ok"
                        clean_end = True
                        self._count_tokens(rec, tracker, raw)
                        self.pipeline.account(rec)
                        if tail:
                            await out.write(tail)
                        break
                    data = tracker.feed(chunk)
                    if data:
                        await out.write(data)
                        if rec.ttft is None:
                            rec.ttft = time.perf_counter() - rec.t0
                await out.write_eof()
            except ConnectionResetError:
                if not rec.accounted:
                    rec.status, rec.error_class = "cancelled", "client_disconnected"
                clean_end = False
            return out
        finally:
            rec.upstream_end = rec.upstream_end or time.perf_counter()
            if clean_end:
                upstream.release()
            else:
                upstream.close()  # drops the connection: the upstream sees the request cancelled
            if not rec.accounted:
                self._count_tokens(rec, tracker, raw)

    @staticmethod
    def _count_tokens(rec: Record, tracker: StreamUsage, raw: bytes) -> None:
        if rec.upstream_end is None:
            rec.upstream_end = time.perf_counter()
        if tracker.seen_usage and not tracker.bad_usage:
            rec.input_tokens, rec.output_tokens, rec.cached_input_tokens, rec.cache_write_tokens = (
                tracker.usage()
            )
            if not tracker.output_final:  # cut before the final count: what was relayed, estimated
                rec.output_tokens = max(rec.output_tokens, tracker.estimated_output_tokens())
                rec.estimated = True
        elif rec.http_status == 200:
            rec.input_tokens = estimate_tokens(raw)
            rec.output_tokens = tracker.estimated_output_tokens()
            rec.estimated = True
