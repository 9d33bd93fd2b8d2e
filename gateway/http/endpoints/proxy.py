"""The four proxy endpoints: chat completions, Responses, Messages and count_tokens.

Each request goes through the pipeline (gateway.http.pipeline): authenticate, read and check the body, route
the public model to its provider, admit, send, then relay the answer (whole or as a stream) while counting its
tokens. Bodies pass through untouched except the model id and, for chat streams, ``stream_options``.

**Any client on any model.** Each attempt's target (a deployment, gateway.upstream.routing) speaks its
provider's wire format. A target of the client's own kind gets the body as above (no translation, no parsing
of the answer beyond the usage). Any other target gets a translated request (gateway.translate): Anthropic
Messages for an anthropic provider, chat completions for an openai one (every OpenAI-compatible API has
those), on that format's path and with its headers (``anthropic-version`` for Anthropic; ``anthropic-beta``
and ``openai-beta`` are not sent across: a beta flag only unlocks request fields, and every field the body
uses is translated or refused by name). Its answer, whole, streamed (event by event as it arrives) or an
error, is translated back to the client's format; its tokens are counted on the upstream's own bytes. A
feature with no equivalent is a 400 naming it, before any upstream call. ``count_tokens`` on a model served by
an openai provider is answered here, with the gateway's estimate of the translated request.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.core.metrics import client_label
from gateway.core.record import Record
from gateway.core.usage import Api, StreamUsage, estimate_output_tokens, estimate_tokens, usage_details
from gateway.errors import (
    ApiStyle,
    BadRequest,
    Forbidden,
    GatewayError,
    NotFound,
    UpstreamError,
    error_response,
    sse_error_event,
    upstream_error_is_shaped,
)
from gateway.http.pipeline import (
    Pipeline,
    StreamShape,
    credential_refused,
    dump_json,
    header,
    parse_json_object,
    read_body,
)
from gateway.summaries.schema import SUMMARIES_PATH
from gateway.translate import Format, StreamTranslator, translate_error, translate_request, translate_response
from gateway.translate.api import ANTHROPIC_VERSION as DEFAULT_ANTHROPIC_VERSION
from gateway.translate.namespaces import tool_names
from gateway.upstream.client import UpstreamResult, client_retry_after
from gateway.upstream.routing import Deployment, ModelDeployments, RoutePlan

log = logging.getLogger("gateway")

FORWARD_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta", "accept")
# "translation": answer what each of the model's deployments would be sent, without sending it (the doctor)
DRY_RUN_HEADER = "X-Farm-Dry-Run"
SUMMARIES_HINT = SUMMARIES_PATH
# After the gateway has retried, the client must not retry again on top (both SDKs honour this header):
# one client call then costs at most max_retries + 1 upstream attempts.
NO_CLIENT_RETRY = {"x-should-retry": "false"}


# A target whose provider kind is not the client's gets this format (every OpenAI-compatible API has chat
# completions), on this path.
UPSTREAM_FORMAT: dict[str, Format] = {"anthropic": "messages", "openai": "chat"}
UPSTREAM_PATH = {"messages": "/messages", "chat": "/chat/completions"}
# Headers that only mean something to one provider kind: not sent to a target of another kind.
_KIND_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta")


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # chat | responses | messages | count_tokens
    style: ApiStyle  # the provider kind it speaks natively
    path: str  # appended to the provider's base_url
    usage_api: Api | None  # None: the request consumes no tokens
    fmt: Format  # the client's wire format


CHAT = Endpoint("chat", "openai", "/chat/completions", "chat", "chat")
RESPONSES = Endpoint("responses", "openai", "/responses", "responses", "responses")
MESSAGES = Endpoint("messages", "anthropic", "/messages", "messages", "messages")
COUNT_TOKENS = Endpoint("count_tokens", "anthropic", "/messages/count_tokens", None, "messages")
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


def translated_headers(headers: dict[str, str], kind: str) -> dict[str, str]:
    """The client's headers for a target of provider ``kind`` that is not the client's: the other kind's
    version and beta flags dropped, ``anthropic-version`` set for Anthropic (the client's, if it sent one)."""
    out = {k: v for k, v in headers.items() if k not in _KIND_HEADERS}
    if kind == "anthropic":
        out["anthropic-version"] = headers.get("anthropic-version", DEFAULT_ANTHROPIC_VERSION)
    return out


class Proxy:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.router = pipeline.services.router
        # what the pipeline runs for each endpoint (``serve``'s ``handle``), made once
        self.handlers = {ep.name: functools.partial(self._handle, ep) for ep in ENDPOINTS.values()}

    async def handle(self, request: web.Request, ep: Endpoint) -> web.StreamResponse:
        return await self.pipeline.serve(request, ep.name, ep.style, self.handlers[ep.name])

    async def _handle(self, ep: Endpoint, request: web.Request, rec: Record) -> web.StreamResponse:
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

        router = self.router
        models = router.models.get(head.model)
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
        if ep is COUNT_TOKENS and models.kind != ep.style:
            return self._count_locally(rec, body, models)

        strip_usage = False
        if ep is CHAT and head.stream:
            opts = body.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage")):
                strip_usage = True  # the client did not ask for the usage chunk: the gateway does
        bodies: dict[str, bytes] = {}
        if strip_usage:
            opts = body.get("stream_options")
            body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
            if opts is None:  # appended to the client's bytes (an object with a "model"): no re-encoding
                end = raw.rstrip().rfind(b"}")
                bodies[head.model] = raw[:end] + b',"stream_options":{"include_usage":true}}'
        else:
            bodies[head.model] = raw  # sent as it came when the upstream id is the public one
        translated: dict[tuple[str, str, bool], tuple[str, bytes, dict[str, str]]] = {}
        dropped_by: dict[tuple[str, str, bool], list[str]] = {}  # the fields each translation left out

        def prepare(target: Deployment) -> bytes | tuple[str, bytes, dict[str, str]]:
            """What one attempt's target gets: the body with its upstream model id (encoded once per id), or
            for a target of another kind the translated (path, body, headers)."""
            if target.kind != ep.style:
                return translate_for(target)
            out = bodies.get(target.upstream_model)
            if out is None:
                body["model"] = target.upstream_model
                out = bodies[target.upstream_model] = dump_json(body)
            return out

        def translate_for(target: Deployment) -> tuple[str, bytes, dict[str, str]]:
            dst = UPSTREAM_FORMAT[target.kind]
            key = (dst, target.upstream_model, target.effort)
            out = translated.get(key)
            if out is None:
                dropped = dropped_by[key] = []
                try:
                    tb = translate_request(
                        body, ep.fmt, dst, upstream_model=target.upstream_model,
                        default_max_tokens=project.default_max_tokens,
                        strict=project.translation == "strict", dropped=dropped, effort=target.effort,
                    )  # fmt: skip
                except BadRequest as e:
                    if target.model != head.model:  # a fallback model's format: say which
                        e.message = f"fallback model {target.model!r} ({target.kind}): {e.message}"
                    raise
                out = translated[key] = (
                    UPSTREAM_PATH[dst],
                    dump_json(tb),
                    translated_headers(headers, target.kind),
                )
            return out

        for d in models.deployments:  # the primary's translations now: an untranslatable field is a 400 here
            if d.kind != ep.style:
                translate_for(d)
        if header(request, DRY_RUN_HEADER) == "translation":
            return self._dry_run(rec, ep, models, dropped_by)

        input_estimate = estimate_tokens(raw)
        cap = head.token_cap()
        tokens = input_estimate + (cap or 0) if ep.usage_api is not None else 0  # for deployments' tpm
        plan = router.plan(head.model, project, tokens=tokens, prepare=prepare)

        if ep.usage_api is None:  # count_tokens: no tokens consumed, no limits
            try:
                result = await pipeline.send(rec, plan, ep.path, raw, headers)
            finally:
                self._note_target(rec, plan, ep)
            if result.status >= 400:
                return self._upstream_error(result, ep, rec)
            return self._with_route(result, await self._respond_whole(result, ep, rec, raw), ep)

        def on_target() -> None:
            self._note_target(rec, plan, ep)
            target = plan.target
            if target is not None and target.kind != ep.style:
                rec.dropped = dropped_by.get(
                    (UPSTREAM_FORMAT[target.kind], target.upstream_model, target.effort), []
                )
                if rec.dropped:
                    self._report_dropped(rec, request)

        try:
            async with pipeline.exchange(
                rec, plan, (ep.path, raw, headers), token_cap=cap, input_estimate=input_estimate,
                on_target=on_target,
            ) as result:  # fmt: skip
                if result.status >= 400:
                    return self._upstream_error(result, ep, rec)
                if head.stream:
                    return await self._respond_stream(request, result, ep, rec, raw, strip_usage, body)
                return self._with_route(result, await self._respond_whole(result, ep, rec, raw, body), ep)
        except GatewayError as e:
            extra = self._route_headers(plan.target, ep)
            if rec.retries:
                extra.update(NO_CLIENT_RETRY)
            if e.headers is None:
                e.headers = extra
            raise

    def _report_dropped(self, rec: Record, request: web.Request) -> None:
        """Fields the translation left out: counted by client and field, and logged the first time each
        (the ledger row and the x-farm-dropped header carry them too)."""
        client = client_label(request.headers.get("User-Agent"))
        for name in self.pipeline.services.metrics.dropped(client, rec.dropped):
            log.warning(
                "translation dropped the request field %r of a %s client (%s -> %s): not known to the "
                "gateway; set the project's translation: strict to refuse it instead (reported once)",
                name, client, rec.endpoint, rec.translation,
            )  # fmt: skip

    @staticmethod
    def _note_target(rec: Record, plan: RoutePlan, ep: Endpoint) -> None:
        """The ledger's view of where the request went: the final attempt's deployment, and the
        translation ("messages->chat") when it speaks another format than the client."""
        target = plan.target
        if target is not None:
            rec.deployment, rec.provider = target.name, target.provider
            rec.upstream_model = target.upstream_model
            if plan.fallback_from is not None:
                rec.fallback_from = plan.fallback_from
            rec.translation = None if target.kind == ep.style else f"{ep.fmt}->{UPSTREAM_FORMAT[target.kind]}"

    @staticmethod
    def _dry_run(rec: Record, ep: Endpoint, models: ModelDeployments, dropped_by: dict) -> web.Response:
        """``X-Farm-Dry-Run: translation`` (``farm gateway doctor``): what each of the model's deployments
        would be sent, without sending it: the translation and the fields it would drop (a field it would
        refuse was the 400 already). No upstream call, no tokens; the row says ``dry_run``."""
        out = []
        for d in models.deployments:
            dst = UPSTREAM_FORMAT[d.kind] if d.kind != ep.style else ep.fmt
            dropped = dropped_by.get((dst, d.upstream_model, d.effort), []) if dst != ep.fmt else []
            how = f"{ep.fmt}->{dst}" if dst != ep.fmt else ""
            out.append({"deployment": d.name, "provider": d.provider, "format": dst, "translation": how,
                        "dropped": dropped})  # fmt: skip
        rec.dropped = list(dict.fromkeys(f for d in out for f in d["dropped"]))
        rec.translation = next((d["translation"] for d in out if d["translation"]), "")
        rec.status, rec.http_status, rec.error_class = "ok", 200, "dry_run"
        body = {"object": "farm.dry_run", "model": models.model, "format": ep.fmt, "deployments": out}
        return web.json_response(body, headers={"x-request-id": rec.request_id, "x-farm-model": models.model})

    def _count_locally(self, rec: Record, body: dict, models: ModelDeployments) -> web.Response:
        """count_tokens for a model served by an openai provider (which has no such endpoint): the gateway's
        estimate of the request translated to chat completions, with no upstream call."""
        first = models.deployments[0]
        chat = translate_request(body, "messages", "chat", upstream_model=first.upstream_model)
        rec.translation = "messages->chat"
        rec.provider, rec.upstream_model = first.provider, first.upstream_model
        rec.status, rec.http_status = "ok", 200
        return web.json_response(
            {"input_tokens": estimate_tokens(dump_json(chat))},
            headers={"x-request-id": rec.request_id, "x-farm-model": models.model},
        )

    @staticmethod
    def _route_headers(target: Deployment | None, ep: Endpoint) -> dict[str, str]:
        """``x-farm-model`` (the public model that answered: a fallback's when one did),
        ``x-farm-deployment`` (its deployment) and, when its format is not the client's,
        ``x-farm-translation`` ("messages->chat")."""
        if target is None:
            return {}
        headers = {"x-farm-model": target.model, "x-farm-deployment": target.name}
        if target.kind != ep.style:
            headers["x-farm-translation"] = f"{ep.fmt}->{UPSTREAM_FORMAT[target.kind]}"
        return headers

    def _with_route(self, result: UpstreamResult, resp: web.Response, ep: Endpoint) -> web.Response:
        resp.headers.update(self._route_headers(result.target, ep))
        return resp

    def _upstream_error(self, result: UpstreamResult, ep: Endpoint, rec: Record) -> web.Response:
        """An upstream's own error answer, passed on with its status (never its 401/403: those refused
        the gateway's provider key, not the client's)."""
        rec.upstream_end = time.perf_counter()
        status = result.status
        rec.status, rec.http_status, rec.error_class = "error", status, f"upstream_{status}"
        extra = self._route_headers(result.target, ep)
        if rec.retries:
            extra.update(NO_CLIENT_RETRY)
        if status in (401, 403):
            rec.http_status = 502
            return error_response(
                ep.style,
                502,
                credential_refused(rec.provider, status),
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
        target = result.target
        if target is not None and target.kind != ep.style:  # the error of a translated target
            src = UPSTREAM_FORMAT[target.kind]
            out = translate_error(parsed if parsed is not None else body, src, ep.fmt, status=status)
            return web.Response(
                status=status, body=dump_json(out), content_type="application/json", headers=headers
            )
        if upstream_error_is_shaped(ep.style, parsed):
            return web.Response(status=status, body=body, content_type="application/json", headers=headers)
        detail = body[:500].decode("utf-8", "replace").strip()
        message = f"upstream {rec.provider!r} returned HTTP {status}" + (f": {detail}" if detail else "")
        return error_response(
            ep.style, status, message, retry_after=retry_after, request_id=rec.request_id, headers=extra
        )

    async def _respond_whole(
        self, result: UpstreamResult, ep: Endpoint, rec: Record, raw: bytes, body: dict | None = None
    ) -> web.Response:
        upstream = result.response
        try:
            data = await upstream.read()
        finally:
            upstream.release()
            rec.upstream_end = time.perf_counter()
        target = result.target
        src: Format | None = None  # the upstream's format when it is not the client's
        if target is not None and target.kind != ep.style:
            src = UPSTREAM_FORMAT[target.kind]
        content_type = upstream.headers.get("Content-Type", "application/json")
        if ep.usage_api is not None:
            try:
                parsed = parse_json_object(data)
            except GatewayError:
                parsed = None
            usage = usage_details(src or ep.usage_api, parsed)
            if usage is not None:
                rec.input_tokens, rec.output_tokens, rec.cached_input_tokens, rec.cache_write_tokens = usage
            else:
                rec.input_tokens, rec.output_tokens = estimate_tokens(raw), estimate_output_tokens(data)
                rec.estimated = True
            if src is not None:
                data = self._translate_answer(rec, parsed, src, ep.fmt, body)
                content_type = "application/json"
        rec.status, rec.http_status = "ok", result.status
        headers = {"Content-Type": content_type, "x-request-id": rec.request_id}
        if rec.dropped:
            headers["x-farm-dropped"] = ",".join(rec.dropped)
        # The row is written by the pipeline (serve) when this returns, before the answer leaves.
        return web.Response(status=result.status, body=data, headers=headers)

    def _translate_answer(
        self, rec: Record, parsed: dict | None, src: Format, dst: Format, body: dict | None = None
    ) -> bytes:
        """A translated target's whole answer in the client's format; a 502 when it cannot be read (its
        tokens are counted on the record all the same: the upstream did answer)."""
        try:
            if parsed is None:
                raise ValueError("not a JSON object")
            names = tool_names(body) if dst == "responses" else None  # Codex's namespaced tools
            out = translate_response(parsed, src, dst, public_model=rec.public_model or "", tool_names=names)
        except (GatewayError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            detail = e.message if isinstance(e, GatewayError) else str(e)
            detail = detail.removeprefix("invalid request body: ")  # a field of the answer, not the request
            raise UpstreamError(
                f"upstream {rec.provider!r} sent an answer that cannot be translated to {dst}: {detail}",
                error_class="untranslatable_answer",
            ) from None
        return dump_json(out)

    async def _respond_stream(
        self,
        request: web.Request,
        result: UpstreamResult,
        ep: Endpoint,
        rec: Record,
        raw: bytes,
        strip_usage: bool,
        body: dict | None = None,
    ) -> web.StreamResponse:
        upstream = result.response
        assert upstream is not None  # an answer below 400 holds its open response
        target = result.target
        if target is None or target.kind == ep.style:  # the client's own format: bytes pass through
            shape: StreamShape = _PassThrough(ep, raw, strip_usage)
            content_type = upstream.headers.get("Content-Type", "text/event-stream")
        else:  # translated event by event; the translator counts the upstream's tokens as it reads them
            shape = _Translated(UPSTREAM_FORMAT[target.kind], ep, rec, raw, strip_usage, body)
            content_type = "text/event-stream"
        headers = {
            "Content-Type": content_type,
            "Cache-Control": "no-cache",
            "x-request-id": rec.request_id,
            **self._route_headers(target, ep),
        }
        if rec.dropped:
            headers["x-farm-dropped"] = ",".join(rec.dropped)
        return await self.pipeline.relay(request, rec, upstream, shape, headers)


class _Counted:
    """A stream's tokens onto its record: the upstream's own count when it sent one, else an estimate."""

    tracker: StreamUsage
    raw: bytes

    def count(self, rec: Record) -> None:
        tracker = self.tracker
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
            rec.input_tokens = estimate_tokens(self.raw)
            rec.output_tokens = tracker.estimated_output_tokens()
            rec.estimated = True


class _PassThrough(_Counted):
    """The client's own format: the upstream's bytes as they are (a chat stream's usage chunk taken out
    when the gateway asked for it), counted on the way."""

    def __init__(self, ep: Endpoint, raw: bytes, strip_usage: bool) -> None:
        self.tracker, self.raw = StreamUsage(ep.usage_api, strip_usage), raw
        self.style, self.responses_api = ep.style, ep is RESPONSES
        self.feed, self.finish = self.tracker.feed, self.tracker.finish

    def error_event(self, status: int, message: str) -> bytes:
        return sse_error_event(self.style, status, message, responses_api=self.responses_api)

    @property
    def failed(self) -> str | None:
        return None  # an upstream error event passes through as it is


class _Translated(_Counted):
    """Another format's stream, translated event by event into the client's."""

    def __init__(
        self, src: Format, ep: Endpoint, rec: Record, raw: bytes, strip_usage: bool, body: dict | None = None
    ) -> None:
        names = tool_names(body) if ep.fmt == "responses" else None  # Codex's namespaced tools
        self.translator = StreamTranslator(
            src, ep.fmt, public_model=rec.public_model or "", include_usage=not strip_usage, tool_names=names
        )
        self.tracker, self.raw = self.translator.tokens, raw  # fed the parsed events, not the bytes again
        self.feed, self.finish = self.translator.feed, self.translator.finish
        self.error_event = self.translator.error_event

    @property
    def failed(self) -> str | None:
        """The upstream's error event that ended the stream (translated into the client's), if one did."""
        return self.translator.failed
