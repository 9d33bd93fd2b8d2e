"""``POST /v1/farm/summaries``: the route in front of the summary batcher (gateway.summaries.batcher), and
the batcher's model calls through the request path.

The route authenticates, reads and checks the request (its fixed format: gateway.summaries.schema) and
answers with the drafts for the caller's own anomaly ids; the request itself is no ledger row, each model
call the batcher makes is one (``PipelineModelCalls``). A model call is written once, in OpenAI chat
completions, and reaches a deployment of another wire format through gateway.translate, as a client's
request would; only ``response_format`` (which Anthropic has no equivalent of) is sent to chat targets
alone, the system prompt asking for the JSON object either way.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import ValidationError

from gateway.core.usage import Api, answer_usage, estimate_tokens
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.http.pipeline import Pipeline, dump_json, parse_json_object, read_body, session_header
from gateway.http.targets import UPSTREAM_PATH, TargetRequests, check_model, upstream_error
from gateway.summaries.batcher import UNCOVERED, SetAnswer, SummaryBatcher
from gateway.summaries.schema import AnomalyIn, SummaryRequest
from gateway.translate import translate_response
from gateway.translate.cache_points import auto_cache_models

if TYPE_CHECKING:
    from gateway.config import ProjectConfig
    from gateway.core.record import Record
    from gateway.upstream.client import UpstreamResult


class SummariesEndpoint:
    def __init__(self, pipeline: Pipeline, batcher: SummaryBatcher) -> None:
        self.pipeline, self.batcher = pipeline, batcher
        self.settings = pipeline.services.settings
        self.cfg = self.settings.summaries

    async def handle(self, request: web.Request) -> web.StreamResponse:
        # Through the pipeline; no ledger row for the request itself: each model call is one.
        return await self.pipeline.serve(request, "summaries", "openai", self._handle, ledger=False)

    async def _handle(self, request: web.Request, _rec: Record) -> web.Response:
        info, project = await self.pipeline.authenticate(request)
        req = _parse(await read_body(request))
        if len(req.anomalies) > self.cfg.max_anomalies_per_request:
            raise PayloadTooLarge(
                f"anomalies: {len(req.anomalies)} in one request, at most "
                f"{self.cfg.max_anomalies_per_request}",
                error_class="too_many_anomalies",
            )
        model = req.model or project.models[0]
        check_model(self.pipeline.services.router, project, info.project, model)
        hashes: dict[str, AnomalyIn] = {}
        ids_by_hash: dict[str, list[str]] = {}
        for a in req.anomalies:
            h = a.content_hash()
            hashes.setdefault(h, a)
            ids_by_hash.setdefault(h, []).append(a.id)
        answer, cached = await self.batcher.answer(
            info.project, req.task, model, info.id, hashes, session_header(request)
        )
        return web.json_response(_reply(answer, ids_by_hash, cached))


def _parse(raw: bytes) -> SummaryRequest:
    body = parse_json_object(raw)
    try:
        return SummaryRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = (
            f"invalid request body: {where}: {err['msg']}" if where else f"invalid request body: {err['msg']}"
        )
        raise BadRequest(msg) from None


def _reply(answer: SetAnswer, ids_by_hash: dict[str, list[str]], cached: bool) -> dict[str, Any]:
    drafts = []
    for d in answer.drafts:
        ids = [i for h in d["anomaly_ids"] for i in ids_by_hash.get(h, [])]
        if ids:
            drafts.append({**d, "anomaly_ids": ids})
    missing = set(answer.missing)
    errors = [
        {"anomaly_id": i, "error": UNCOVERED} for h, ids in ids_by_hash.items() if h in missing for i in ids
    ]
    return {
        "drafts": drafts,
        "errors": errors,
        "model": answer.model,
        "provider": answer.provider,
        "offline": answer.offline,
        "cached": cached,
        # this caller's share of the calls' tokens (by anomalies); a cache hit costs nothing
        "usage": {
            "input_tokens": 0 if cached else round(answer.input_tokens),
            "output_tokens": 0 if cached else round(answer.output_tokens),
        },
        "batch": {
            "requests": answer.batch_requests,
            "items": answer.batch_items,
            "request_ids": answer.request_ids,
        },
    }


class PipelineModelCalls:
    """The batcher's model calls (gateway.summaries.batcher.ModelCalls) through the request path: routed,
    admitted against the project's limits, sent with retries and fallbacks, settled and accounted."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.router = pipeline.services.router
        # the anthropic deployments that get prompt-cache breakpoints (the drafter's system prompt repeats)
        self.auto_cache = auto_cache_models(pipeline.services.settings, pipeline.prices)

    def row(self, rec: Record) -> contextlib.AbstractAsyncContextManager[Record]:
        return self.pipeline.model_call(rec)

    async def complete(
        self,
        rec: Record,
        project: ProjectConfig,
        model: str,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        temperature: float,
    ) -> str:
        """One model call (its own ledger row, ``rec``): the text of the answer."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, *messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        targets = TargetRequests(
            body, "chat", "openai", {"Content-Type": "application/json"}, model=model,
            default_max_tokens=max_tokens, native_fields={"response_format": {"type": "json_object"}},
            auto_cache=self.auto_cache,
        )  # fmt: skip
        plan = self.router.plan(
            model, project, tokens=len(dump_json(body)) // 4 + max_tokens, prepare=targets
        )
        first = targets.request(plan.primary.deployments[0], UPSTREAM_PATH["chat"])

        async with (
            self.pipeline.model_call(rec),
            self.pipeline.exchange(
                rec, plan, first, token_cap=max_tokens, input_estimate=estimate_tokens(first[1]),
                on_target=lambda: targets.note(rec, plan),
            ) as result,
        ):  # fmt: skip
            data = await _answer_body(rec, result)
            try:
                parsed = parse_json_object(data)
            except BadRequest:
                parsed = None
            api: Api = "messages" if plan.target is not None and plan.target.kind == "anthropic" else "chat"
            rec.count(*answer_usage(api, parsed, first[1], data))
            rec.status, rec.http_status = "ok", 200
            return _answer_text(api, parsed)


async def _answer_body(rec: Record, result: UpstreamResult) -> bytes:
    """The answer body of one model call; an upstream error answer becomes an UpstreamError (a 429 or 504
    keeps its status, so the farm can tell "slow down" from "broken")."""
    try:
        if result.status >= 400:
            err = upstream_error(rec, result)
            if err.status not in (429, 504):
                err.status = 502
            raise err
        assert result.response is not None  # an answer below 400 holds its open response
        try:
            return await result.response.read()
        finally:
            result.response.release()
    finally:
        rec.upstream_end = time.perf_counter()


def _answer_text(api: Api, body: dict[str, Any] | None) -> str:
    """The text of a whole answer, read in the chat format (an Anthropic answer translated to it)."""
    if body is None:
        return ""
    if api == "messages":
        try:
            body = translate_response(body, "messages", "chat", public_model="")
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, BadRequest):
            return ""
    choices = body.get("choices") or []
    if choices and isinstance(choices[0], dict):
        return (choices[0].get("message") or {}).get("content") or ""
    return ""
