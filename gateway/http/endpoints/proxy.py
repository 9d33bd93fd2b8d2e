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
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.core.metrics import client_label
from gateway.core.record import Record
from gateway.core.usage import Api, answer_usage, estimate_tokens
from gateway.errors import (
    ApiStyle,
    BadRequest,
    GatewayError,
    UpstreamCredentialRejected,
    UpstreamError,
    error_response,
    upstream_error_is_shaped,
)
from gateway.http.pipeline import Pipeline, dump_json, header, parse_json_object, read_body, session_header
from gateway.http.targets import UPSTREAM_FORMAT, TargetRequests, check_model, translation_of, upstream_error
from gateway.summaries.schema import SUMMARIES_PATH
from gateway.translate import (
    Format,
    stream_translator,
    translate_error,
    translate_request,
    translate_response,
)
from gateway.translate.api import ANTHROPIC_VERSION as DEFAULT_ANTHROPIC_VERSION
from gateway.translate.cache_points import auto_cache_models
from gateway.translate.namespaces import tool_names
from gateway.upstream.client import UpstreamResult
from gateway.upstream.routing import Deployment, ModelDeployments
from gateway.upstream.strategies import WHY_SINGLE

log = logging.getLogger("gateway")

FORWARD_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta", "accept")
# "translation": answer what each of the model's deployments would be sent, without sending it (the doctor)
DRY_RUN_HEADER = "X-Farm-Dry-Run"
SUMMARIES_HINT = SUMMARIES_PATH
# After the gateway has retried, the client must not retry again on top (both SDKs honour this header):
# one client call then costs at most max_retries + 1 upstream attempts.
NO_CLIENT_RETRY = {"x-should-retry": "false"}


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


class Proxy:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.router = pipeline.services.router
        # the anthropic deployments that get prompt-cache breakpoints when a request carries none
        self.auto_cache = auto_cache_models(pipeline.services.settings, pipeline.prices)
        # what the pipeline runs for each endpoint (``serve``'s ``handle``), made once
        self.handlers = {ep.name: functools.partial(self._handle, ep) for ep in ENDPOINTS.values()}

    async def handle(self, request: web.Request, ep: Endpoint) -> web.StreamResponse:
        return await self.pipeline.serve(request, ep.name, ep.style, self.handlers[ep.name])

    async def _handle(self, ep: Endpoint, request: web.Request, rec: Record) -> web.StreamResponse:
        pipeline = self.pipeline
        _info, project = await pipeline.authenticate(request, rec)
        rec.tag(project, header(request, "X-Farm-Task"))
        rec.session_id = session_header(request)
        headers = forward_headers(request, ep)

        raw = await read_body(request)
        body = parse_json_object(raw)
        head = _read_head(body)
        rec.public_model, rec.stream = head.model, head.stream
        models = check_model(self.router, project, rec.project or "", head.model)
        rec.model_label = head.model
        if models.kind == "local":  # the offline drafter serves the summaries endpoint only
            raise BadRequest(
                f"model {head.model!r} is the offline drafter: call it through {SUMMARIES_HINT}",
                error_class="wrong_endpoint",
            )
        if ep is COUNT_TOKENS and models.kind != ep.style:
            return self._count_locally(rec, body, models)

        strip_usage, encoded = _ask_for_usage(ep, head, body, raw)
        targets = TargetRequests(
            body, ep.fmt, ep.style, headers, model=head.model, default_max_tokens=project.default_max_tokens,
            strict=project.translation == "strict", encoded=encoded, auto_cache=self.auto_cache,
        )  # fmt: skip
        targets.check(models)  # the primary's translations now: an untranslatable field is a 400 here
        if header(request, DRY_RUN_HEADER) == "translation":
            return self._dry_run(rec, ep, models, targets)

        input_estimate = estimate_tokens(raw)
        cap = head.token_cap()
        tokens = input_estimate + (cap or 0) if ep.usage_api is not None else 0  # for deployments' tpm
        plan = self.router.plan(head.model, project, tokens=tokens, prepare=targets)

        if ep.usage_api is None:  # count_tokens: no tokens consumed, no limits
            try:
                result = await pipeline.send(rec, plan, ep.path, raw, headers)
            finally:
                targets.note(rec, plan)
            if result.status >= 400:
                return self._upstream_error(result, ep, rec, plan.why)
            return self._with_route(result, await self._respond_whole(result, ep, rec, raw), ep, plan.why)

        def on_target() -> None:
            targets.note(rec, plan)
            if rec.dropped:
                self._report_dropped(rec, request)

        try:
            async with pipeline.exchange(
                rec, plan, (ep.path, raw, headers), token_cap=cap, input_estimate=input_estimate,
                on_target=on_target,
            ) as result:  # fmt: skip
                if result.status >= 400:
                    return self._upstream_error(result, ep, rec, plan.why)
                if head.stream:
                    return await self._respond_stream(
                        request, result, ep, rec, raw, strip_usage, body, plan.why
                    )
                answer = await self._respond_whole(result, ep, rec, raw, body)
                return self._with_route(result, answer, ep, plan.why)
        except GatewayError as e:
            extra = self._route_headers(plan.target, ep, plan.why)
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
    def _dry_run(
        rec: Record, ep: Endpoint, models: ModelDeployments, targets: TargetRequests
    ) -> web.Response:
        """``X-Farm-Dry-Run: translation`` (``farm gateway doctor``): what each of the model's deployments
        would be sent, without sending it: the translation and the fields it would drop (a field it would
        refuse was the 400 already). No upstream call, no tokens; the row says ``dry_run``."""
        out = [
            {"deployment": d.name, "provider": d.provider, "format": targets.upstream_format(d),
             "translation": targets.translation(d) or "", "dropped": targets.dropped(d)}
            for d in models.deployments
        ]  # fmt: skip
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
    def _route_headers(target: Deployment | None, ep: Endpoint, why: str | None = None) -> dict[str, str]:
        """``x-farm-model`` (the public model that answered: a fallback's when one did),
        ``x-farm-deployment`` (its deployment), ``x-farm-route`` (why that deployment, when there was a
        choice: gateway.upstream.strategies) and, when its format is not the client's,
        ``x-farm-translation`` ("messages->chat")."""
        if target is None:
            return {}
        headers = {"x-farm-model": target.model, "x-farm-deployment": target.name}
        if why is not None and why is not WHY_SINGLE:
            headers["x-farm-route"] = why
        translation = translation_of(target, ep.fmt, ep.style)
        if translation is not None:
            headers["x-farm-translation"] = translation
        return headers

    def _with_route(
        self, result: UpstreamResult, resp: web.Response, ep: Endpoint, why: str | None
    ) -> web.Response:
        resp.headers.update(self._route_headers(result.target, ep, why))
        return resp

    def _upstream_error(
        self, result: UpstreamResult, ep: Endpoint, rec: Record, why: str | None = None
    ) -> web.Response:
        """An upstream's own error answer, passed on with its status (never its 401/403: those refused
        the gateway's provider key, not the client's): as it came when it is in the client's shape,
        translated when the target speaks another format, else in the client's shape naming the provider."""
        err = upstream_error(rec, result)
        extra = self._route_headers(result.target, ep, why)
        if rec.retries:
            extra.update(NO_CLIENT_RETRY)
        if isinstance(err, UpstreamCredentialRejected):
            return error_response(
                ep.style, err.status, err.message, code=err.code, request_id=rec.request_id, headers=extra
            )
        status = result.status
        headers = {"x-request-id": rec.request_id, **extra}
        if err.retry_after:
            headers["Retry-After"] = err.retry_after
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
        return error_response(
            ep.style, status, err.message, retry_after=err.retry_after, request_id=rec.request_id,
            headers=extra,
        )  # fmt: skip

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
            rec.count(*answer_usage(src or ep.usage_api, parsed, raw, data))
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
        why: str | None = None,
    ) -> web.StreamResponse:
        upstream = result.response
        assert upstream is not None  # an answer below 400 holds its open response
        target = result.target
        src: Format = ep.fmt
        if target is None or target.kind == ep.style:  # the client's own format: the bytes pass through
            content_type = upstream.headers.get("Content-Type", "text/event-stream")
        else:  # translated event by event; the translator counts the upstream's tokens as it reads them
            src, content_type = UPSTREAM_FORMAT[target.kind], "text/event-stream"
        translator = stream_translator(
            src, ep.fmt, public_model=rec.public_model or "", include_usage=not strip_usage,
            tool_names=tool_names(body) if ep.fmt == "responses" else None,  # Codex's namespaced tools
        )  # fmt: skip
        shape = _Relayed(translator, raw)
        headers = {
            "Content-Type": content_type,
            "Cache-Control": "no-cache",
            "x-request-id": rec.request_id,
            **self._route_headers(target, ep, why),
        }
        if rec.dropped:
            headers["x-farm-dropped"] = ",".join(rec.dropped)
        return await self.pipeline.relay(request, rec, upstream, shape, headers)


def _read_head(body: dict) -> RequestHead:
    try:
        return RequestHead.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise BadRequest(f"invalid request body: {field}: {err['msg']}") from None


def _ask_for_usage(ep: Endpoint, head: RequestHead, body: dict, raw: bytes) -> tuple[bool, dict[str, bytes]]:
    """A chat stream's usage chunk, asked for when the client did not (``stream_options.include_usage``;
    then taken out of the stream again: the first value), and the client's body as it is sent to the public
    model's id: its bytes, with the option appended when the client sent no ``stream_options``."""
    if ep is not CHAT or not head.stream:
        return False, {head.model: raw}  # sent as it came when the upstream id is the public one
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        return False, {head.model: raw}
    body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    if opts is not None:
        return True, {}
    end = raw.rstrip().rfind(b"}")  # appended to the client's bytes (an object with a "model"): no re-encode
    return True, {head.model: raw[:end] + b',"stream_options":{"include_usage":true}}'}


class _Relayed:
    """A stream as the pipeline relays it (``StreamShape``): its translator (gateway.translate; the client's
    own format passes through) and, onto the record, the tokens it counted: the upstream's own, else an
    estimate."""

    __slots__ = ("translator", "raw", "feed", "finish", "error_event")

    def __init__(self, translator: Any, raw: bytes) -> None:
        self.translator, self.raw = translator, raw
        self.feed, self.finish, self.error_event = translator.feed, translator.finish, translator.error_event

    @property
    def failed(self) -> str | None:
        """The upstream's error event that ended a translated stream, if one did (one in the client's own
        format passes through as it is)."""
        return self.translator.failed

    def count(self, rec: Record) -> None:
        if rec.upstream_end is None:
            rec.upstream_end = time.perf_counter()
        counted = self.translator.tokens.counted(self.raw, rec.http_status == 200)
        if counted is not None:
            rec.count(*counted)
