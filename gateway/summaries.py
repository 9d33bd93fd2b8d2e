"""The summary batcher: ``POST /v1/farm/summaries``, compressed anomalies in, fixed-format drafts out.

A caller (the farm, with a project key) sends ``{"task": "checklist"|"log_summary", "model"?: ...,
"anomalies": [AnomalyIn, ...]}``. Requests of the same project, task and model that arrive within
``summaries.window_ms`` are gathered into one model call (sooner when ``max_items`` anomalies are
waiting); equal anomalies from several callers are sent once. The answer must be JSON and validate as
``DraftList``: an invalid one gets one repair call, then every caller of the batch gets a 502 that says
why. Each caller gets only the drafts that name its own anomalies, under its own ids.

Answers are cached by content hash of (project, task, model, the set of anomalies): the same set never
costs a project a second model call, including while the first is still in flight; projects never share
answers. Every model call (repairs included, the offline drafter too) is one ledger row on endpoint
``summaries`` with the task and ``batch_size`` (the anomalies sent). A model whose provider is ``local``,
or whose provider's API key variable is unset, is served by the offline drafter and the answer says
``"offline": true``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import ValidationError

from gateway.drafter_local import offline_drafts
from gateway.errors import GatewayError, error_response
from gateway.http1 import TransportError
from gateway.limits import LimitExceeded
from gateway.summary_schema import AnomalyIn, Draft, DraftList, SummaryRequest
from gateway.usage import estimate_output_tokens, estimate_tokens, usage_from_body

if TYPE_CHECKING:
    from gateway.app import Gateway, Record

log = logging.getLogger("gateway.summaries")

SUMMARIES_PATH = "/v1/farm/summaries"

SYSTEM_PROMPT = """\
You draft acceptance items for GPU kernel engineers. A benchmark farm found anomalies and sends each one
compressed: an id, its kind and severity, the interface (family, backend, signature), the config fields
that differ from the baseline, a short log excerpt (warnings and errors only), the card's expected metrics
next to the measured values, and prohibitions.
Answer with ONE JSON object and nothing else, in exactly this shape:
{"drafts": [{"assertion": str, "verify_how": str, "failure_signature": str,
             "needs_local_profiler": bool, "anomaly_ids": [str, ...]}]}
- assertion: one checkable statement with the numbers it must meet.
- verify_how: how an engineer verifies it on the farm (farm commands, local profilers), briefly.
- failure_signature: the pattern that identifies this failure when it recurs (a log line, a metric).
- needs_local_profiler: true only when deciding it needs a profiler run on a GPU host.
- anomaly_ids: the ids of the anomalies the draft explains; every anomaly id appears in some draft.
Obey every prohibition: never write a full kernel implementation, never production SQL, never a command
to run against shared systems. Only drafts: you run nothing.
"""

TASK_PROMPTS = {
    "checklist": "Task: checklist. Write at least one assertion per anomaly; merge anomalies only when one "
    "assertion covers them.",
    "log_summary": "Task: log_summary. Group the anomalies by the failure their log excerpts show; one draft "
    "per distinct failure, its failure_signature the distinctive log line.",
}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class SetAnswer:
    """The drafts for one anomaly set, with anomaly ids as content hashes (caller-independent)."""

    drafts: list[dict[str, Any]]
    model: str
    provider: str
    offline: bool
    input_tokens: int
    output_tokens: int
    batch_requests: int
    batch_items: int
    items: int  # anomalies of this set
    request_ids: list[str]


@dataclass
class _Pending:
    set_key: str
    hashes: dict[str, AnomalyIn]  # content hash -> anomaly, this set's
    future: asyncio.Future[SetAnswer]


@dataclass
class _Batch:
    project: str
    task: str
    model: str
    key_id: str
    sets: list[_Pending] = field(default_factory=list)
    items: dict[str, AnomalyIn] = field(default_factory=dict)  # content hash -> anomaly, deduplicated
    timer: asyncio.TimerHandle | None = None


class SummaryBatcher:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.cfg = gw.settings.summaries
        self._open: dict[tuple[str, str, str], _Batch] = {}
        self._in_flight: dict[str, asyncio.Future[SetAnswer]] = {}
        self._cache: OrderedDict[str, SetAnswer] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.model_calls = 0

    # --- the route -------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._handle(request)
        except GatewayError as e:
            return error_response(
                "openai", e.status, e.message, code=e.code, retry_after=e.retry_after, limit=e.limit
            )

    async def _handle(self, request: web.Request) -> web.Response:
        info, project = await self.gw._authenticate(request)
        from gateway.app import read_body

        req = self._parse(await read_body(request))
        if len(req.anomalies) > self.cfg.max_anomalies_per_request:
            raise GatewayError(
                413,
                f"anomalies: {len(req.anomalies)} in one request, at most "
                f"{self.cfg.max_anomalies_per_request}",
                error_class="too_many_anomalies",
            )
        model = req.model or project.models[0]
        if model not in self.gw.settings.models:
            raise GatewayError(404, f"model {model!r} does not exist", error_class="model_unknown")
        if model not in project.models:
            raise GatewayError(
                403, f"project {info.project!r} is not allowed to use model {model!r}",
                error_class="model_forbidden",
            )  # fmt: skip
        hashes: dict[str, AnomalyIn] = {}
        ids_by_hash: dict[str, list[str]] = {}
        for a in req.anomalies:
            h = a.content_hash()
            hashes.setdefault(h, a)
            ids_by_hash.setdefault(h, []).append(a.id)
        # The project is part of the key: another project's answer was paid from its limits, budget and
        # ledger, so it is never handed out across projects (cached or in flight).
        set_key = _digest([info.project, req.task, model, sorted(hashes)])
        cached = set_key in self._cache
        if cached:
            self._cache.move_to_end(set_key)
            answer = self._cache[set_key]
        else:
            fut = self._in_flight.get(set_key)
            if fut is None:
                fut = self._enqueue(info.project, req.task, model, info.id, set_key, hashes)
            answer = await asyncio.shield(fut)
        return web.json_response(self._reply(answer, ids_by_hash, cached))

    def _parse(self, raw: bytes) -> SummaryRequest:
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise GatewayError(
                400, f"request body is not valid JSON: {e}", error_class="bad_request"
            ) from None
        try:
            return SummaryRequest.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = (
                f"invalid request body: {where}: {err['msg']}"
                if where
                else f"invalid request body: {err['msg']}"
            )
            raise GatewayError(400, msg, error_class="bad_request") from None

    @staticmethod
    def _reply(answer: SetAnswer, ids_by_hash: dict[str, list[str]], cached: bool) -> dict[str, Any]:
        drafts = []
        for d in answer.drafts:
            ids = [i for h in d["anomaly_ids"] for i in ids_by_hash.get(h, [])]
            if ids:
                drafts.append({**d, "anomaly_ids": ids})
        return {
            "drafts": drafts,
            "model": answer.model,
            "provider": answer.provider,
            "offline": answer.offline,
            "cached": cached,
            # this caller's share of the batch's tokens (by anomalies); a cache hit costs nothing
            "usage": {
                "input_tokens": 0 if cached else _share(answer.input_tokens, answer),
                "output_tokens": 0 if cached else _share(answer.output_tokens, answer),
            },
            "batch": {
                "requests": answer.batch_requests,
                "items": answer.batch_items,
                "request_ids": answer.request_ids,
            },
        }

    # --- the window ------------------------------------------------------------------------------
    def _enqueue(
        self, project: str, task: str, model: str, key_id: str, set_key: str, hashes: dict[str, AnomalyIn]
    ) -> asyncio.Future[SetAnswer]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SetAnswer] = loop.create_future()
        fut.add_done_callback(_consume_exception)
        self._in_flight[set_key] = fut
        bkey = (project, task, model)
        batch = self._open.get(bkey)
        new_items = [h for h in hashes if batch is None or h not in batch.items]
        if batch is not None and len(batch.items) + len(new_items) > self.cfg.max_items:
            self._flush(bkey)  # this set would overfill the batch: send what waits, start a new one
            batch = None
        if batch is None:
            batch = _Batch(project, task, model, key_id)
            self._open[bkey] = batch
            batch.timer = loop.call_later(self.cfg.window_ms / 1000, self._flush, bkey)
        batch.sets.append(_Pending(set_key, hashes, fut))
        batch.items.update(hashes)
        if len(batch.items) >= self.cfg.max_items:
            self._flush(bkey)
        return fut

    def _flush(self, bkey: tuple[str, str, str]) -> None:
        batch = self._open.pop(bkey, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        task = asyncio.create_task(self._run(batch), name=f"summaries-{bkey[0]}-{bkey[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, _app: web.Application | None = None) -> None:
        for bkey in list(self._open):
            self._flush(bkey)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- one model call for a batch --------------------------------------------------------------
    async def _run(self, batch: _Batch) -> None:
        try:
            answer = await self._call(batch)
        except BaseException as e:
            err = e if isinstance(e, GatewayError) else None
            if err is None:
                log.exception("summaries batch failed")
                err = GatewayError(
                    500, "internal gateway error in the summary batcher", error_class="internal"
                )
            for p in batch.sets:
                self._in_flight.pop(p.set_key, None)
                if not p.future.done():
                    p.future.set_exception(err)
            if not isinstance(e, Exception):
                raise
            return
        for p in batch.sets:
            mine = set(p.hashes)
            drafts = []
            for d in answer.drafts:
                ids = [h for h in d["anomaly_ids"] if h in mine]
                if ids:
                    drafts.append({**d, "anomaly_ids": ids})
            result = SetAnswer(**{**answer.__dict__, "drafts": drafts, "items": len(mine)})
            if self.cfg.cache_entries:
                self._cache[p.set_key] = result
                while len(self._cache) > self.cfg.cache_entries:
                    self._cache.popitem(last=False)
            self._in_flight.pop(p.set_key, None)
            if not p.future.done():
                p.future.set_result(result)

    async def _call(self, batch: _Batch) -> SetAnswer:
        """The drafts of the batch (ids as content hashes) from the model, with one repair attempt."""
        settings = self.gw.settings
        route = settings.models[batch.model]
        provider = settings.providers[route.provider]
        local_ids = {h: f"a{i + 1}" for i, h in enumerate(batch.items)}
        by_local = {v: k for k, v in local_ids.items()}
        items = [a.model_copy(update={"id": local_ids[h]}) for h, a in batch.items.items()]
        offline = provider.kind == "local" or bool(
            provider.api_key_env and not os.environ.get(provider.api_key_env)
        )
        common = dict(
            model=batch.model,
            provider="local" if offline else route.provider,
            offline=offline,
            batch_requests=len(batch.sets),
            batch_items=len(items),
            items=len(items),
        )
        if offline:
            rec = self._record(batch, "local", "offline-drafter")
            drafts = offline_drafts(items, batch.task)
            rec.status, rec.http_status = "ok", 200
            self.gw._finish(rec)
            self.model_calls += 1
            return SetAnswer(
                drafts=_to_hashes(drafts, by_local), input_tokens=0, output_tokens=0,
                request_ids=[rec.request_id], **common,
            )  # fmt: skip
        max_tokens = (
            self.cfg.checklist_max_tokens if batch.task == "checklist" else self.cfg.log_summary_max_tokens
        )
        user = json.dumps(
            {"task": batch.task, "anomalies": [a.model_dump(mode="json") for a in items]},
            separators=(",", ":"),
        )
        messages: list[dict[str, str]] = [{"role": "user", "content": TASK_PROMPTS[batch.task] + "\n" + user}]
        totals = [0, 0]
        request_ids: list[str] = []
        problem = ""
        for attempt in range(2):
            text = await self._model_call(
                batch, route, provider.kind, messages, max_tokens, totals, request_ids
            )
            drafts, problem = _validate(text, set(by_local))
            if drafts is not None:
                return SetAnswer(
                    drafts=_to_hashes(drafts, by_local), input_tokens=totals[0], output_tokens=totals[1],
                    request_ids=request_ids, **common,
                )  # fmt: skip
            log.warning("summaries: invalid model answer (attempt %d): %s", attempt + 1, problem)
            messages = messages + [
                {"role": "assistant", "content": text[:8000]},
                {
                    "role": "user",
                    "content": f"That answer is invalid: {problem}. Answer again with only the JSON object "
                    'in the required shape {"drafts": [...]}, nothing else.',
                },
            ]
        raise GatewayError(
            502,
            f"the model's answer was not valid drafts after one repair attempt: {problem}",
            error_class="invalid_model_answer",
        )

    def _record(self, batch: _Batch, provider: str, upstream_model: str) -> Record:
        from gateway.app import Record

        project = self.gw.settings.projects[batch.project]
        rec = Record("summaries")
        rec.project, rec.key_id = batch.project, batch.key_id
        rec.public_model = rec.model_label = batch.model
        rec.upstream_model, rec.provider = upstream_model, provider
        rec.task = batch.task
        rec.task_label = (
            batch.task if batch.task in project.tasks or batch.task == project.default_task else "other"
        )
        rec.batch_size = len(batch.items)
        return rec

    async def _model_call(
        self,
        batch: _Batch,
        route: Any,
        kind: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        totals: list[int],
        request_ids: list[str],
    ) -> str:
        """One upstream call (a ledger row); returns the answer's text."""
        rec = self._record(batch, route.provider, route.upstream_model)
        request_ids.append(rec.request_id)
        self.model_calls += 1
        body: dict[str, Any] = {
            "model": route.upstream_model,
            "max_tokens": max_tokens,
            "temperature": self.cfg.temperature,
        }
        if kind == "anthropic":
            body.update(system=SYSTEM_PROMPT, messages=messages)
            path, api, headers = "/messages", "messages", {"anthropic-version": "2023-06-01"}
        else:
            body.update(
                messages=[{"role": "system", "content": SYSTEM_PROMPT}, *messages],
                response_format={"type": "json_object"},
            )
            path, api, headers = "/chat/completions", "chat", {}
        raw = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
        try:
            admission = await self.gw.limits[batch.project].admit(max_tokens)
        except LimitExceeded as e:
            self.gw.metrics.rejections.labels(batch.project, e.limit).inc()
            rec.status, rec.http_status, rec.error_class = "rejected", 429, f"limit_{e.limit}"
            self.gw._finish(rec)
            raise GatewayError(
                429,
                e.message,
                error_class=f"limit_{e.limit}",
                retry_after=e.retry_after_header,
                limit=e.limit,
            ) from None
        rec.queue_wait = admission.queue_wait_s
        try:
            data = await self._send(rec, path, raw, headers)
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            usage = usage_from_body(api, parsed)  # type: ignore[arg-type]
            if usage is not None:
                rec.input_tokens, rec.output_tokens = usage
            else:
                rec.input_tokens, rec.output_tokens = estimate_tokens(raw), estimate_output_tokens(data)
                rec.estimated = True
            totals[0] += rec.input_tokens
            totals[1] += rec.output_tokens
            rec.status, rec.http_status = "ok", 200
            return _answer_text(api, parsed)
        finally:
            admission.release()
            admission.settle(rec.input_tokens + rec.output_tokens)
            self.gw._finish(rec)

    async def _send(self, rec: Record, path: str, raw: bytes, headers: dict[str, str]) -> bytes:
        from gateway.upstream import UpstreamTimeout, UpstreamUnreachable, client_retry_after

        client = self.gw.clients[rec.provider]
        rec.upstream_t0 = time.perf_counter()

        def on_retry(reason: str) -> None:
            rec.retries += 1
            self.gw.metrics.retries.labels(rec.project, rec.model_label, reason).inc()

        try:
            result = await client.send(path, raw, headers, on_retry)
            if result.status >= 400:
                rec.status, rec.http_status, rec.error_class = (
                    "error",
                    result.status,
                    f"upstream_{result.status}",
                )
                if result.status in (401, 403):  # the gateway's own provider key; its body stays here
                    rec.http_status = 502
                    raise GatewayError(
                        502,
                        f"upstream {rec.provider!r} rejected the gateway's provider credential "
                        f"(HTTP {result.status}); this is a gateway configuration problem, not your API "
                        "key: tell the gateway operator",
                        error_class=f"upstream_{result.status}",
                        code="upstream_credential_rejected",
                    )
                detail = (result.body or b"")[:300].decode("utf-8", "replace").strip()
                raise GatewayError(
                    result.status if result.status in (429, 504) else 502,
                    f"upstream {rec.provider!r} returned HTTP {result.status}"
                    + (f": {detail}" if detail else ""),
                    error_class=f"upstream_{result.status}",
                    retry_after=client_retry_after(result.headers),
                )
            try:
                return await result.response.read()
            finally:
                result.response.release()
        except UpstreamTimeout as e:
            rec.http_status, rec.error_class = 504, "read_timeout"
            raise GatewayError(504, str(e), error_class="read_timeout") from None
        except (UpstreamUnreachable, TransportError) as e:
            rec.http_status, rec.error_class = 502, "unreachable"
            raise GatewayError(502, f"upstream {rec.provider!r}: {e}", error_class="unreachable") from None
        finally:
            rec.upstream_end = time.perf_counter()


def _consume_exception(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # a batch error nobody awaited any more must not be logged as "never retrieved"


def _share(total: int, answer: SetAnswer) -> int:
    return round(total * answer.items / answer.batch_items) if answer.batch_items else 0


def _to_hashes(drafts: list[Draft], by_local: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for d in drafts:
        ids = [by_local[i] for i in dict.fromkeys(d.anomaly_ids) if i in by_local]
        out.append({**d.model_dump(mode="json"), "anomaly_ids": ids})
    return out


def _answer_text(api: str, body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    if api == "messages":
        parts = body.get("content") or []
        return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
    choices = body.get("choices") or []
    if choices and isinstance(choices[0], dict):
        return (choices[0].get("message") or {}).get("content") or ""
    return ""


def _validate(text: str, known_ids: set[str]) -> tuple[list[Draft] | None, str]:
    """The drafts of a model answer, or None and what is wrong with it (for the repair prompt)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None, "no JSON object found in the answer"
    try:
        obj = json.loads(text[start : end + 1])
    except ValueError as e:
        return None, f"not valid JSON ({e})"
    if isinstance(obj, list):
        obj = {"drafts": obj}
    try:
        drafts = DraftList.model_validate(obj).drafts
    except ValidationError as e:
        err = e.errors()[0]
        return None, f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    for i, d in enumerate(drafts):
        unknown = [x for x in d.anomaly_ids if x not in known_ids]
        if unknown:
            return None, f"drafts.{i}.anomaly_ids: unknown ids {unknown} (known: {sorted(known_ids)})"
    if not drafts:
        return None, "drafts: empty list"
    return drafts, ""
