"""The summary batcher behind ``POST /v1/farm/summaries`` (the route: gateway.http.endpoints.summaries):
compressed anomalies in, fixed-format drafts out.

A caller (the farm, with a project key) sends ``{"task": "checklist"|"log_summary", "model"?: ...,
"anomalies": [AnomalyIn, ...]}``. Requests of the same project, task, model and agent session (the
request's ``session-id`` or ``X-Claude-Code-Session-Id`` header, as on the proxy) that arrive within
``summaries.window_ms`` are gathered into one model call (sooner when ``max_items`` anomalies are
waiting); equal anomalies from several callers are sent once. No model call carries more than
``max_items`` anomalies: a request with more is split, in its own order, into chunks of at most
``max_items``, each batched like a request of its own (other callers' requests may share its window), and
the caller gets the merged drafts of all its chunks.

The answer must be JSON, validate as ``DraftList`` and cover every anomaly id it was sent (each id in the
``anomaly_ids`` of some draft). An invalid answer, or one with a gap, gets one repair call; for a gap the
repair prompt names the missing ids and asks for drafts for them only (the drafts already given stand).
Each caller gets only the drafts that name its own anomalies, under its own ids. The reply::

    {"drafts": [{"assertion", "verify_how", "failure_signature", "needs_local_profiler", "anomaly_ids"}],
     "errors": [{"anomaly_id": "<the caller's id>",
                 "error": "the model's answer did not cover this anomaly after one repair attempt"}],
     "model", "provider", "offline", "cached", "usage": {"input_tokens", "output_tokens"},
     "batch": {"requests", "items", "request_ids"}}

HTTP status: 200 when at least one of the caller's anomalies is covered, the uncovered ones (if any) listed
in ``errors`` (empty when all are covered); 502 when none is covered, or when the answer is still invalid
after the repair. When a model call of a split request fails (a limit, the upstream), the request gets that
call's error. ``batch`` describes the model calls that served the caller: ``requests`` the request sets
they served, ``items`` the anomalies they carried, ``request_ids`` the ledger ids of every call (chunks
and repairs); ``usage`` is the caller's share of their tokens, by anomalies.

Answers are cached by content hash of (project, task, model, the whole set of anomalies of a request): the
same set never costs a project a second model call, including while the first is still in flight;
projects never share answers. Only complete answers are cached: an answer with a gap goes to the callers
waiting for it and is then dropped, so the same request asks the model again. Every model call (repairs
included, the offline drafter too) is one ledger row on endpoint ``summaries`` with the task, the agent
session of its requests and ``batch_size`` (the anomalies sent). A model whose provider is ``local``, or
whose provider's API key variable is unset, is served by the offline drafter (it covers every anomaly) and
the answer says ``"offline": true``.

With ``redis_url`` (gateway.redis.channels) the cache and the coalescing span every process sharing that
Redis: a set's complete answer is also kept there, and the first process to take the set's lock makes the
model call while the others wait for its outcome (``_shared_answer``); without Redis, or while it is down,
all of this stays in the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.core.record import Record
from gateway.errors import GatewayError, UpstreamBadAnswer
from gateway.summaries.drafts import (
    SYSTEM_PROMPT,
    TASK_PROMPTS,
    _restrict,
    _restrict_drafts,
    _to_hashes,
    _validate,
)
from gateway.summaries.offline import offline_drafts
from gateway.summaries.schema import SUMMARIES_PATH as SUMMARIES_PATH  # the path both sides use
from gateway.summaries.schema import AnomalyIn, Draft

if TYPE_CHECKING:
    from gateway.config import GatewaySettings, ProjectConfig
    from gateway.redis.state import SharedState

log = logging.getLogger("gateway.summaries.batcher")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


UNCOVERED = "the model's answer did not cover this anomaly after one repair attempt"


@dataclass
class SetAnswer:
    """The drafts for one anomaly set (or one chunk of it), ids as content hashes (caller-independent)."""

    drafts: list[dict[str, Any]]
    missing: list[str]  # content hashes no draft covers after the repair; such an answer is never cached
    model: str
    provider: str
    offline: bool
    input_tokens: float  # this set's share of the calls' tokens, by anomalies
    output_tokens: float
    batch_requests: int  # request sets the calls served
    batch_items: int  # anomalies the calls carried
    request_ids: list[str]  # every model call (chunks and repairs)
    sets: frozenset[str] = frozenset()  # set keys the calls served (to merge chunks; empty once merged)


@dataclass
class _CallAnswer:
    """What one batch's model call (and its repair) gave: drafts and gaps by content hash, token totals."""

    drafts: list[dict[str, Any]]
    missing: set[str]
    provider: str
    offline: bool
    input_tokens: int
    output_tokens: int
    request_ids: list[str]


@dataclass
class _Pending:
    set_key: str
    hashes: dict[str, AnomalyIn]  # content hash -> anomaly: the set's chunk in this batch
    future: asyncio.Future[SetAnswer]  # this chunk's answer


@dataclass
class _Batch:
    project: str
    task: str
    model: str
    key_id: str
    session_id: str | None  # the agent session of its requests (batches are per session), None: none
    sets: list[_Pending] = field(default_factory=list)
    items: dict[str, AnomalyIn] = field(default_factory=dict)  # content hash -> anomaly, deduplicated
    timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class _Caller:
    """Who asks for a set: the project and its key, the task, the model, the agent session (or None)."""

    project: str
    task: str
    model: str
    key_id: str
    session_id: str | None

    @property
    def batch_key(self) -> tuple[str, ...]:
        """The open batch a chunk of this caller joins: one model call is one project's, task's, model's
        and agent session's."""
        return (self.project, self.task, self.model, self.session_id or "")


class ModelCalls(Protocol):
    """How the batcher's model calls are made (gateway.http.endpoints.summaries: through the request path,
    each one ledger row)."""

    def row(self, rec: Record) -> contextlib.AbstractAsyncContextManager[Record]:
        """A model call made here (the offline drafter) as its own ledger row, written when it ends."""
        ...

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
        """One upstream model call (its ledger row is ``rec``): the text of the answer."""
        ...


class SummaryBatcher:
    def __init__(self, settings: GatewaySettings, shared: SharedState | None, calls: ModelCalls) -> None:
        self.settings, self.shared, self.calls = settings, shared, calls
        self.cfg = settings.summaries
        self._open: dict[tuple[str, str, str], _Batch] = {}
        self._in_flight: dict[str, asyncio.Future[SetAnswer]] = {}
        self._cache: OrderedDict[str, SetAnswer] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.model_calls = 0
        self._shared_tasks: set[asyncio.Future[SetAnswer]] = set()  # coalescing across processes

    async def answer(
        self,
        project: str,
        task: str,
        model: str,
        key_id: str,
        hashes: dict[str, AnomalyIn],
        session_id: str | None = None,
    ) -> tuple[SetAnswer, bool]:
        """The drafts for one request's anomaly set (content hash -> anomaly), and whether they came from
        the cache. ``session_id``: the request's agent session; the model calls made for it are rows of
        that session (requests of several sessions are batched apart, so each call's row has one)."""
        who = _Caller(project, task, model, key_id, session_id)
        # The project is part of the key: another project's answer was paid from its limits, budget and
        # ledger, so it is never handed out across projects (cached or in flight).
        set_key = _digest([project, task, model, sorted(hashes)])
        if set_key in self._cache:
            self._cache.move_to_end(set_key)
            return self._cache[set_key], True
        if self.shared is not None and self.shared.up:
            return await self._shared_answer(who, set_key, hashes)
        fut = self._in_flight.get(set_key)
        if fut is None:
            fut = self._enqueue(who, set_key, hashes)
        return await asyncio.shield(fut), False

    # --- the window ------------------------------------------------------------------------------
    def _enqueue(self, who: _Caller, set_key: str, hashes: dict[str, AnomalyIn]) -> asyncio.Future[SetAnswer]:
        """The set's future answer (in flight from now on); its chunks (<= ``max_items``) join batches."""
        fut: asyncio.Future[SetAnswer] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume_exception)
        self._in_flight[set_key] = fut
        order, step = list(hashes), self.cfg.max_items
        parts = [
            self._add(who, set_key, {h: hashes[h] for h in order[i : i + step]})
            for i in range(0, len(order), step)
        ]
        left = len(parts)

        def part_done(_part: asyncio.Future[SetAnswer]) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                self._settle(set_key, parts, fut)

        for part in parts:
            part.add_done_callback(part_done)
        return fut

    def _add(self, who: _Caller, set_key: str, hashes: dict[str, AnomalyIn]) -> asyncio.Future[SetAnswer]:
        """One chunk of a set into the open batch of its caller's project, task, model and session; the
        future of the chunk's answer."""
        bkey = who.batch_key
        loop = asyncio.get_running_loop()
        part: asyncio.Future[SetAnswer] = loop.create_future()
        part.add_done_callback(_consume_exception)
        batch = self._open.get(bkey)
        if batch is not None and (
            len(batch.items) + sum(h not in batch.items for h in hashes) > self.cfg.max_items
            or any(p.set_key == set_key for p in batch.sets)
        ):
            self._flush(bkey)  # the chunk would overfill the batch (or it holds a chunk of this set): send it
            batch = None
        if batch is None:
            batch = _Batch(who.project, who.task, who.model, who.key_id, who.session_id)
            self._open[bkey] = batch
            batch.timer = loop.call_later(self.cfg.window_ms / 1000, self._flush, bkey)
        batch.sets.append(_Pending(set_key, hashes, part))
        batch.items.update(hashes)
        if len(batch.items) >= self.cfg.max_items:
            self._flush(bkey)
        return part

    def _settle(
        self, set_key: str, parts: list[asyncio.Future[SetAnswer]], fut: asyncio.Future[SetAnswer]
    ) -> None:
        """Every chunk of a set is answered: merge, cache the answer if complete, resolve the set's future."""
        if self._in_flight.get(set_key) is fut:
            del self._in_flight[set_key]
        if fut.done():
            return
        try:
            fut.set_result(self._merge(set_key, parts))
        except GatewayError as e:
            fut.set_exception(e)
        except Exception:
            log.exception("summaries: merging the chunks of a set failed")
            fut.set_exception(
                GatewayError(500, "internal gateway error in the summary batcher", error_class="internal")
            )

    def _merge(self, set_key: str, parts: list[asyncio.Future[SetAnswer]]) -> SetAnswer:
        for part in parts:  # any failed chunk fails the request, with its error
            if part.cancelled():
                raise GatewayError(
                    500, "internal gateway error in the summary batcher", error_class="internal"
                )
            if (err := part.exception()) is not None:
                raise err
        answers = [part.result() for part in parts]
        sets = frozenset().union(*(a.sets for a in answers))
        answer = SetAnswer(
            drafts=[d for a in answers for d in a.drafts],
            missing=[h for a in answers for h in a.missing],
            model=answers[0].model,
            provider=answers[0].provider,
            offline=any(a.offline for a in answers),
            input_tokens=sum(a.input_tokens for a in answers),
            output_tokens=sum(a.output_tokens for a in answers),
            batch_requests=len(sets),
            batch_items=sum(a.batch_items for a in answers),
            request_ids=[r for a in answers for r in a.request_ids],
        )
        if not answer.drafts:
            raise UpstreamBadAnswer(
                f"the model's answer did not cover any of the {len(answer.missing)} anomalies of this "
                "request after one repair attempt",
                error_class="incomplete_model_answer",
            )
        if not answer.missing and self.cfg.cache_entries:  # an incomplete answer is never cached
            self._cache[set_key] = answer
            while len(self._cache) > self.cfg.cache_entries:
                self._cache.popitem(last=False)
        return answer

    def _flush(self, bkey: tuple[str, ...]) -> None:
        batch = self._open.pop(bkey, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        task = asyncio.create_task(self._run(batch), name=f"summaries-{bkey[0]}-{bkey[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for bkey in list(self._open):
            self._flush(bkey)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for fut in list(self._shared_tasks):  # waiting for another process's answer
            fut.cancel()
        if self._shared_tasks:
            await asyncio.gather(*self._shared_tasks, return_exceptions=True)

    # --- across processes (gateway.redis.channels) -----------------------------------------------------
    async def _shared_answer(
        self, who: _Caller, set_key: str, hashes: dict[str, AnomalyIn]
    ) -> tuple[SetAnswer, bool]:
        """The set's answer and whether it was cached: from Redis' cache, or from the one model call for
        the set among all processes (this one's, or another's that this one waits for)."""
        from gateway.redis.errors import SharedUnavailable

        shared = self.shared
        assert shared is not None
        fut = self._in_flight.get(set_key)
        if fut is None:
            try:
                blob = await shared.summaries.get(set_key)
            except SharedUnavailable:
                blob = None
            if blob is not None:
                answer = _decode_outcome(blob)
                self._remember(set_key, answer)
                return answer, True
            fut = self._in_flight.get(set_key)  # another request of this process may have begun meanwhile
            if fut is None:
                fut = asyncio.ensure_future(self._coalesce(who, set_key, hashes))
                fut.add_done_callback(_consume_exception)
                self._in_flight[set_key] = fut
                self._shared_tasks.add(fut)

                def done(f: asyncio.Future[SetAnswer]) -> None:
                    self._shared_tasks.discard(f)
                    if self._in_flight.get(set_key) is f:
                        del self._in_flight[set_key]

                fut.add_done_callback(done)
        return await asyncio.shield(fut), False

    async def _coalesce(self, who: _Caller, set_key: str, hashes: dict[str, AnomalyIn]) -> SetAnswer:
        """Take the set's lock and make the call here (storing the outcome for the waiting processes), or
        wait for the process that holds it. Redis failing on the way: the call is made here."""
        from gateway.redis.errors import SharedUnavailable

        shared = self.shared
        assert shared is not None
        try:
            kind, value = await shared.summaries.claim(set_key)
        except SharedUnavailable:
            return await asyncio.shield(self._enqueue(who, set_key, hashes))
        if kind == "answer":
            answer = _decode_outcome(value)
            self._remember(set_key, answer)
            return answer
        token = value
        try:
            answer = await asyncio.shield(self._enqueue(who, set_key, hashes))
        except GatewayError as e:
            await shared.summaries.done(set_key, token, _encode_error(e), complete=False)
            raise
        except BaseException:
            await asyncio.shield(shared.summaries.done(set_key, token, b"", complete=False))
            raise
        await shared.summaries.done(set_key, token, _encode_answer(answer), complete=not answer.missing)
        return answer

    def _remember(self, set_key: str, answer: SetAnswer) -> None:
        """Another process's complete answer goes to this process's cache too."""
        if not answer.missing and self.cfg.cache_entries:
            self._cache[set_key] = answer
            while len(self._cache) > self.cfg.cache_entries:
                self._cache.popitem(last=False)

    # --- one model call for a batch --------------------------------------------------------------
    async def _run(self, batch: _Batch) -> None:
        """Answer every chunk waiting in the batch (the sets' futures settle once all their chunks are)."""
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
                if not p.future.done():
                    p.future.set_exception(err)
            if not isinstance(e, Exception):
                raise
            return
        sets = frozenset(p.set_key for p in batch.sets)
        for p in batch.sets:
            share = len(p.hashes) / len(batch.items)
            result = SetAnswer(
                drafts=_restrict(answer.drafts, set(p.hashes)),
                missing=[h for h in p.hashes if h in answer.missing],
                model=batch.model,
                provider=answer.provider,
                offline=answer.offline,
                input_tokens=answer.input_tokens * share,
                output_tokens=answer.output_tokens * share,
                batch_requests=len(sets),
                batch_items=len(batch.items),
                request_ids=answer.request_ids,
                sets=sets,
            )
            if not p.future.done():
                p.future.set_result(result)

    async def _call(self, batch: _Batch) -> _CallAnswer:
        """The drafts of the batch (ids as content hashes) from the model, with one repair attempt for an
        invalid answer or one that leaves anomaly ids uncovered; the ids still uncovered after it."""
        settings = self.settings
        route = settings.models[batch.model]
        provider = settings.providers[route.provider]
        local_ids = {h: f"a{i + 1}" for i, h in enumerate(batch.items)}
        by_local = {v: k for k, v in local_ids.items()}
        items = [a.model_copy(update={"id": local_ids[h]}) for h, a in batch.items.items()]
        offline = provider.kind == "local" or bool(
            provider.api_key_env and not os.environ.get(provider.api_key_env)
        )
        if offline:
            async with self.calls.row(self._record(batch, "local", "offline-drafter")) as rec:
                drafts = _restrict_drafts(offline_drafts(items, batch.task), set(by_local))
                rec.status, rec.http_status = "ok", 200
            self.model_calls += 1
            covered = {i for d in drafts for i in d.anomaly_ids}
            return _CallAnswer(
                drafts=_to_hashes(drafts, by_local),
                missing={h for i, h in by_local.items() if i not in covered},
                provider="local",
                offline=True,
                input_tokens=0,
                output_tokens=0,
                request_ids=[rec.request_id],
            )
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
        kept: list[Draft] = []  # the valid drafts so far, each naming only ids no earlier draft covers
        covered: set[str] = set()
        problem = ""
        for attempt in range(2):
            text = await self._model_call(batch, route, messages, max_tokens, totals, request_ids)
            drafts, problem = _validate(text, set(by_local))
            if drafts is not None:
                new = _restrict_drafts(drafts, set(by_local) - covered)
                kept += new
                covered.update(i for d in new for i in d.anomaly_ids)
                missing = [i for i in by_local if i not in covered]
                if not missing:
                    break
                problem = f"anomaly ids not covered by any draft: {', '.join(missing)}"
                repair = (
                    f"Your answer did not cover these anomaly ids: {', '.join(missing)}. Every anomaly id "
                    "must appear in the anomaly_ids of some draft. Answer with only the JSON object in the "
                    'required shape {"drafts": [...]} with drafts for these ids; the drafts you already '
                    "wrote stand."
                )
            else:
                repair = (
                    f"That answer is invalid: {problem}. Answer again with only the JSON object "
                    'in the required shape {"drafts": [...]}, nothing else.'
                )
            log.warning("summaries: unusable model answer (attempt %d): %s", attempt + 1, problem)
            if attempt == 0:
                messages = messages + [
                    {"role": "assistant", "content": text[:8000]},
                    {"role": "user", "content": repair},
                ]
        if not kept:
            raise UpstreamBadAnswer(
                f"the model's answer was not valid drafts after one repair attempt: {problem}",
                error_class="invalid_model_answer",
            )
        return _CallAnswer(
            drafts=_to_hashes(kept, by_local),
            missing={h for i, h in by_local.items() if i not in covered},
            provider=route.provider,
            offline=False,
            input_tokens=totals[0],
            output_tokens=totals[1],
            request_ids=request_ids,
        )

    def _record(self, batch: _Batch, provider: str, upstream_model: str) -> Record:
        rec = Record("summaries")
        rec.project, rec.key_id, rec.session_id = batch.project, batch.key_id, batch.session_id
        rec.public_model = rec.model_label = batch.model
        rec.upstream_model, rec.provider = upstream_model, provider
        rec.tag(self.settings.projects[batch.project], batch.task)
        rec.batch_size = len(batch.items)
        return rec

    async def _model_call(
        self,
        batch: _Batch,
        route: Any,
        messages: list[dict[str, str]],
        max_tokens: int,
        totals: list[int],
        request_ids: list[str],
    ) -> str:
        """One upstream call (a ledger row); returns the answer's text."""
        rec = self._record(batch, route.provider, route.upstream_model)
        request_ids.append(rec.request_id)
        self.model_calls += 1
        project = self.settings.projects[batch.project]
        text = await self.calls.complete(
            rec, project, batch.model, SYSTEM_PROMPT, messages, max_tokens, self.cfg.temperature
        )
        totals[0] += rec.input_tokens
        totals[1] += rec.output_tokens
        return text


def _encode_answer(answer: SetAnswer) -> bytes:
    data = dataclasses.asdict(answer)
    data.pop("sets", None)
    return json.dumps({"answer": data}, separators=(",", ":")).encode()


def _encode_error(e: GatewayError) -> bytes:
    fields = ("status", "message", "error_class", "code", "retry_after", "limit")
    return json.dumps({"error": {f: getattr(e, f) for f in fields}}, separators=(",", ":")).encode()


def _decode_outcome(blob: bytes) -> SetAnswer:
    """A set's outcome stored by another process: its answer, or the error its call gave."""
    data = json.loads(blob)
    if "error" in data:
        err = data["error"]
        raise GatewayError(
            err["status"],
            err["message"],
            error_class=err["error_class"],
            code=err.get("code"),
            retry_after=err.get("retry_after"),
            limit=err.get("limit"),
        )
    return SetAnswer(**data["answer"])


def _consume_exception(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # a batch error nobody awaited any more must not be logged as "never retrieved"
