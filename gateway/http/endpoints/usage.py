"""``POST /v1/usage/requests``: the ledger rows of a caller's own request ids (the farm's token account,
jobs.drafts.account, reads what its drafts cost through it).

The caller authenticates with its project key, as on every endpoint, and sends ``{"request_ids": [...]}``
(at most ``MAX_USAGE_IDS``; the contract is gateway.summaries.schema). The answer holds the rows of those ids
that belong to the key's project (date, task, model, key id, tokens, cost, retries, upstream 429s, retry
wait, the output cap asked for) and lists every other id under ``unknown``: an id of another project is
never described, not even as someone else's. The rows this process still holds unwritten are written
first, so a call made just before is in the answer; a row still held by another process is not (it is
``unknown`` until that process writes it, within its ledger interval). The request itself is no ledger row.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import ValidationError

from gateway.errors import BadRequest
from gateway.http.pipeline import Pipeline, parse_json_object, read_body
from gateway.store.ledger_queries import request_rows
from gateway.summaries.schema import MAX_USAGE_IDS, UsageRequest

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from gateway.core.record import Record


class UsageEndpoint:
    def __init__(self, pipeline: Pipeline, engine: AsyncEngine) -> None:
        self.pipeline, self.engine = pipeline, engine
        self.ledger = pipeline.services.ledger
        self.timeout_s = pipeline.services.settings.key_lookup_timeout_s

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await self.pipeline.serve(request, "usage", "openai", self._handle, ledger=False)

    async def _handle(self, request: web.Request, _rec: Record) -> web.Response:
        info, _project = await self.pipeline.authenticate(request)
        ids = _parse(await read_body(request))
        with contextlib.suppress(Exception):  # a failed flush keeps its rows and says so itself (/readyz)
            await self.ledger.flush()
        rows = await request_rows(self.engine, info.project, ids, timeout_s=self.timeout_s)
        found = {r["request_id"] for r in rows}
        unknown = sorted({i for i in ids if i not in found})
        return web.json_response({"project": info.project, "rows": rows, "unknown": unknown})


def _parse(raw: bytes) -> list[str]:
    body = parse_json_object(raw)
    ids = body.get("request_ids")
    if isinstance(ids, list) and len(ids) > MAX_USAGE_IDS:
        raise BadRequest(
            f"request_ids: {len(ids)} ids in one request, at most {MAX_USAGE_IDS}; send them in several "
            "requests",
            error_class="too_many_ids",
        )
    try:
        return UsageRequest.model_validate(body).request_ids
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadRequest(f"invalid request body: {where}: {err['msg']}" if where else err["msg"]) from None
