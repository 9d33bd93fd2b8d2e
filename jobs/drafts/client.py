"""Drafts: a job's anomalies, compressed, sent through the gateway's summaries endpoint; drafts stored back.

`draft_job(store, job_id)` compresses the job's stored anomalies (jobs.drafts.compress), sends them with the
project's key through the openai SDK to ``POST <gateway>/v1/farm/summaries`` and stores the drafts with
the job (tables draft_runs, drafts), with the sizes before and after compression and the tokens spent.
A draft's check (the metric card's grammar) is validated against the card schema here: one that does not
validate is stored as its reason (`check_error`) beside the draft's prose. An anomaly whose latest draft
was rejected (`farm drafts review --reject`) is not sent again while what would be sent is the same (its
compressed item's digest, kept per draft); the skip is counted.
The gateway is named by ``FARM_GATEWAY_URL`` (with or without /v1) and the key by ``FARM_GATEWAY_KEY``
(jobs.settings). Without a key, the gateway's offline drafter runs in-process (marked offline), so the
workflow runs with no gateway and no network. `render_drafts` prints them next to the anomalies they explain.

The farm is the gateway's client only: it shares the endpoint's path and formats through
gateway.summaries.schema (pydantic alone) and, for the offline case, calls gateway.summaries.offline (a pure
function of that schema); nothing else of the gateway is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gateway.summaries.schema import SUMMARIES_PATH, TASKS, AnomalyIn
from jobs.drafts.compress import Compressed, LogSource, compress, content_digest, facts_from_job, without
from jobs.drafts.review import rejected_fingerprints, validate_check
from jobs.settings import FarmSettings
from jobs.store import DraftRecord, DraftRunRecord, Store


@dataclass(frozen=True)
class GatewayTarget:
    base_url: str  # the gateway's URL, with or without /v1
    api_key: str
    model: str | None = None  # None: the project's first model
    timeout_s: float = 180.0
    session: str | None = None  # the agent session the model calls are counted under (``session-id``)

    @property
    def root(self) -> str:
        """The gateway's root URL: SUMMARIES_PATH (which starts with /v1) goes after it."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    @classmethod
    def from_settings(cls, settings: FarmSettings | None = None) -> GatewayTarget | None:
        """FARM_GATEWAY_URL / FARM_GATEWAY_KEY (and FARM_GATEWAY_MODEL, FARM_GATEWAY_SESSION); None when
        the key is unset."""
        settings = settings or FarmSettings.load()
        if not settings.gateway_key:
            return None
        return cls(
            settings.gateway_url,
            settings.gateway_key,
            settings.gateway_model,
            session=settings.gateway_session,
        )


class DraftsError(RuntimeError):
    """The gateway refused or failed; the message says why (its own error message included)."""


@dataclass
class DraftOutcome:
    job_id: int
    run_id: int | None
    compressed: Compressed
    reply: dict[str, Any]
    skipped: list[str] = field(default_factory=list)  # fingerprints not sent: their latest draft was rejected

    @property
    def drafts(self) -> list[dict[str, Any]]:
        return self.reply.get("drafts", [])


def post_json(target: GatewayTarget, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the gateway's ``path`` with the project key (and the target's agent session as
    ``session-id``), through the openai SDK (retries 429/5xx with backoff); the answer's JSON, or
    DraftsError saying what the gateway said or that it is unreachable."""
    import openai

    headers = {"session-id": target.session} if target.session else {}
    with openai.OpenAI(base_url=target.root, api_key=target.api_key, timeout=target.timeout_s) as client:
        try:
            text = client.post(path, cast_to=str, body=body, options={"headers": headers})
        except openai.APIStatusError as e:
            raise DraftsError(f"gateway answered HTTP {e.status_code}: {e.message}") from None
        except openai.APIConnectionError as e:
            raise DraftsError(f"gateway at {target.base_url} unreachable: {e}") from None
    return json.loads(text)


def request_drafts(items: list[dict[str, Any]], task: str, target: GatewayTarget) -> dict[str, Any]:
    """One call of the summaries endpoint."""
    body: dict[str, Any] = {"task": task, "anomalies": items}
    if target.model:
        body["model"] = target.model
    return post_json(target, SUMMARIES_PATH, body)


def offline_reply(items: list[dict[str, Any]], task: str) -> dict[str, Any]:
    """The gateway's offline drafter, run in-process (no gateway configured)."""
    from gateway.summaries.offline import offline_drafts

    drafts = offline_drafts([AnomalyIn.model_validate(i) for i in items], task)
    return {
        "drafts": [d.model_dump(mode="json") for d in drafts],
        "model": "offline-drafter",
        "provider": "local (in-process)",
        "offline": True,
        "cached": False,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "batch": None,
    }


def draft_job(
    store: Store,
    job_id: int,
    *,
    task: str = "checklist",
    target: GatewayTarget | None = None,
    use_env: bool = True,
    logs: LogSource | None = None,
) -> DraftOutcome:
    """Compress the job's anomalies, get drafts (gateway, else offline in-process) and store them.
    `target` None with `use_env` reads FARM_GATEWAY_URL/KEY. A job without anomalies stores nothing."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} (got {task!r})")
    if store.get_job(job_id) is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    from jobs.judge.acceptance import card_for

    facts = facts_from_job(store, job_id, logs=logs)
    packed = compress(facts)
    contents = {i["fingerprint"]: content_digest(i) for i in packed.items}
    skipped = sorted(rejected_fingerprints(store, contents))
    packed = without(packed, set(skipped))
    if not packed.items:
        return DraftOutcome(job_id, None, packed, {"drafts": []}, skipped)
    try:
        card = card_for(store, job_id)
    except (LookupError, ValueError):
        card = None
    if target is None and use_env:
        target = GatewayTarget.from_settings()
    reply = request_drafts(packed.items, task, target) if target else offline_reply(packed.items, task)
    usage = reply.get("usage") or {}
    offline = bool(reply.get("offline"))
    run = DraftRunRecord(
        task=task,
        model=reply.get("model"),
        provider=reply.get("provider"),
        offline=offline,
        cached=bool(reply.get("cached")),
        anomalies=len(facts),
        sent=len(packed.items),
        raw_bytes=packed.raw_bytes,
        compressed_bytes=packed.compressed_bytes,
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        batch=reply.get("batch"),
    )
    rows = []
    for d in reply.get("drafts", []):
        check, check_error = validate_check(d.get("check"), card)
        rows.append(
            DraftRecord(
                assertion=d["assertion"],
                verify_how=d["verify_how"],
                failure_signature=d["failure_signature"],
                needs_local_profiler=bool(d["needs_local_profiler"]),
                fingerprints=list(d["anomaly_ids"]),  # the ids sent are the fingerprints
                contents={fp: contents[fp] for fp in d["anomaly_ids"] if fp in contents},
                offline=offline,
                check_spec=check,
                check_error=check_error,
            )
        )
    run_id = store.replace_drafts(job_id, run, rows)
    return DraftOutcome(job_id, run_id, packed, reply, skipped)


def render_drafts(store: Store, job_id: int, console: Console) -> None:
    """The job's drafts next to the anomalies they explain, with the tokens spent; nothing if none."""
    run, drafts = store.drafts(job_id)
    if run is None:
        return
    where = "offline drafter" if run.offline else f"{run.model} via {run.provider}"
    console.print(
        f"[bold]drafts[/bold] ({run.task}, {where}{', cached' if run.cached else ''}): {len(drafts)} drafts; "
        f"{run.sent} of {run.anomalies} anomalies sent (repeats folded), standing for {run.raw_bytes:,} B "
        f"of log and evidence, sent as {run.compressed_bytes:,} B of fixed-format summary; tokens "
        f"{run.input_tokens:,} in, {run.output_tokens:,} out"
    )
    by_fp: dict[str, list[Any]] = {}
    for a in store.anomalies(job_id):
        by_fp.setdefault(a.fingerprint, []).append(a)
    table = Table(show_lines=True)
    for col in ("anomalies", "assertion", "verify how", "failure signature", "profiler"):
        table.add_column(col, overflow="fold")
    for d in drafts:
        explained = [a for fp in d.fingerprints for a in by_fp.get(fp, [])]
        # whole messages: the table wraps them at word boundaries (a cut at N characters split words)
        label = "\n".join(f"{a.kind} ({a.severity}): {a.message}" for a in explained) or ", ".join(
            fp[:12] for fp in d.fingerprints
        )
        table.add_row(
            escape(label),
            escape(d.assertion),
            escape(d.verify_how),
            escape(d.failure_signature),
            "yes" if d.needs_local_profiler else "no",
        )
    console.print(table)
