"""The token account of the drafts (issue 33): what each drafting cost, next to what came of its drafts.

One row per date, task, model, gateway key and agent session: the model calls the draft runs made, their
input, output and total tokens, cost, retries, upstream 429s and the time waited on retries (all read from
the gateway's ledger), the output cap they asked for, the compression the farm achieved before sending, and
the conclusion of the drafts those calls produced.

**Where the numbers come from.** A draft run keeps the gateway request ids of the model calls that served it
(``draft_runs.batch["request_ids"]``, jobs.drafts.client). The farm sends them, with its project key
(``FARM_GATEWAY_URL`` / ``FARM_GATEWAY_KEY``, as the drafts client does), to the gateway's
``POST /v1/usage/requests`` and gets back the ledger rows of those that belong to its project: the farm is the
gateway's client only. A request id is counted once, for the first run (in id order) that keeps it: a cached
answer repeats the ids of the calls that made it, and a batch shared by two jobs' runs names the same calls;
so the account's totals are the ledger's for the same ids. A run drafted by the offline drafter in-process
made no call: it is a row of model ``offline``, key ``-``, zero tokens. When the gateway cannot be read (no
key set, unreachable, refused) or does not know a run's ids, the run's own token counts (its share, as the
summaries reply gave it) are shown instead, marked ``farm-side``, and ``Account.note`` says why.

**The agent session** of a row is the one its calls' ledger rows name (the ``session-id`` the drafts client
sent, ``FARM_GATEWAY_SESSION``; the gateway batches the requests of one session into a model call, so a call
has one): "" when they name none, or the row is farm-side or offline; "mixed" in a rollup over several.

**The conclusion** of a row's drafts (jobs.drafts.review's states): ``pass A/N`` where A drafts were accepted
out of the N the row's runs produced, then the others: ``awaiting the profiler`` (needs_profiler),
``rejected``, ``unreviewed`` (new); e.g. "pass 5/6, 1 awaiting the profiler".

``env_changed`` counts the runs whose job was measured in another environment than its baseline (torch,
CUDA, GPU, ...: the job's environment anomaly), so drafts written about such a job are read as such.

``rollup`` sums rows under another key; the four questions of the account page (jobs.report.account_page)
are rollups: tokens per accepted draft by task and model, input compression per task, output tokens against
``max_tokens`` per task, and spend per project and key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.summaries.schema import MAX_USAGE_IDS, USAGE_PATH, UsageReply
from jobs.drafts.client import DraftsError, GatewayTarget, post_json
from jobs.drafts.review import ACCEPTED, NEEDS_PROFILER, NEW, REJECTED
from jobs.store import Anomaly, DraftRow, DraftRun, Store

OFFLINE, FARM_SIDE, GATEWAY = "offline", "farm-side", "gateway"
SUMS = (  # the fields a rollup adds up
    "runs", "calls", "input_tokens", "output_tokens", "retries", "rate_limited", "retry_wait_ms",
    "capped_calls", "capped_output_tokens", "max_tokens", "anomalies", "sent", "raw_bytes",
    "compressed_bytes", "drafts", "accepted", "rejected", "needs_profiler", "unreviewed", "env_changed",
)  # fmt: skip


def conclusion(drafts: int, accepted: int, needs_profiler: int, rejected: int, unreviewed: int) -> str:
    """'pass 5/6, 1 awaiting the profiler': accepted out of all drafts, then the others by state."""
    if not drafts:
        return "no drafts"
    parts = [f"pass {accepted}/{drafts}"]
    others = ((needs_profiler, "awaiting the profiler"), (rejected, "rejected"), (unreviewed, "unreviewed"))
    for n, words in others:
        if n:
            parts.append(f"{n} {words}")
    return ", ".join(parts)


@dataclass
class AccountRow:
    date: str  # YYYY-MM-DD (UTC): the day of the calls (of the run, when it made none)
    task: str
    model: str  # the public model; "offline": the in-process offline drafter
    key: str  # the gateway key id; "-": no key (offline); "?": not known (farm-side)
    project: str  # the key's project; "-" / "?" as for key
    source: str  # gateway | farm-side | offline (mixed, after a rollup of several)
    session: str = ""  # the agent session of its calls (the ledger's); "": none known; mixed: several
    jobs: list[int] = field(default_factory=list)
    runs: int = 0
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # None: no call with a price (or none at all)
    retries: int = 0
    rate_limited: int = 0  # upstream 429 answers met
    retry_wait_ms: float = 0.0
    capped_calls: int = 0  # calls that asked for max_tokens
    capped_output_tokens: int = 0  # their output tokens
    max_tokens: int = 0  # the sum of their caps
    peak_output_share: float | None = None  # the largest output / max_tokens of one call
    anomalies: int = 0  # the runs' anomalies, before folding repeats
    sent: int = 0  # anomalies sent after folding
    raw_bytes: int = 0  # log and evidence they stand for
    compressed_bytes: int = 0  # the fixed-format summary sent
    drafts: int = 0
    accepted: int = 0
    rejected: int = 0
    needs_profiler: int = 0
    unreviewed: int = 0
    # runs of jobs measured in another environment than their baseline (a component that changes
    # performance: torch, CUDA, GPU, ...; the job's `environment` anomaly, jobs.judge.acceptance)
    env_changed: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def conclusion(self) -> str:
        return conclusion(self.drafts, self.accepted, self.needs_profiler, self.rejected, self.unreviewed)

    def add(self, other: AccountRow) -> None:
        for name in SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cost_usd = _add_cost(self.cost_usd, other.cost_usd)
        self.peak_output_share = _max(self.peak_output_share, other.peak_output_share)
        self.jobs = sorted(set(self.jobs) | set(other.jobs))
        if other.source != self.source:
            self.source = "mixed"
        if other.session != self.session:
            self.session = "mixed"

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(total_tokens=self.total_tokens, conclusion=self.conclusion)
        return out


@dataclass
class Account:
    rows: list[AccountRow]
    note: str | None = None  # why some runs are farm-side (the gateway not read, or not knowing their ids)
    request_ids: list[str] = field(default_factory=list)  # every id counted, once
    unknown: list[str] = field(default_factory=list)  # ids the gateway did not describe for this key

    @property
    def sources(self) -> set[str]:
        return {r.source for r in self.rows}

    def totals(self) -> AccountRow:
        """Every row summed, named "total" (no task, model or key)."""
        if not self.rows:
            return _empty("total")
        return dataclasses.replace(
            rollup(self.rows, lambda _r: ())[0],
            date="total",
            task="",
            model="",
            key="",
            project="",
            session="",
        )

    def as_dict(self) -> dict[str, Any]:
        totals = self.totals().as_dict()
        for name in ("date", "task", "model", "key", "project", "source", "session"):
            totals.pop(name)
        return {
            "rows": [r.as_dict() for r in self.rows],
            "totals": totals,
            "sources": sorted(self.sources),
            "note": self.note,
            "request_ids": self.request_ids,
            "unknown_request_ids": self.unknown,
        }


def _empty(label: str) -> AccountRow:
    return AccountRow(label, "", "", "", "", "")


def _add_cost(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def rollup(rows: Iterable[AccountRow], key: Callable[[AccountRow], tuple]) -> list[AccountRow]:
    """The rows summed by ``key`` (a tuple); the first row of a group names it (its date, task, model,
    key, project, as far as the key keeps them), in the order the groups first appear."""
    groups: dict[tuple, AccountRow] = {}
    for r in rows:
        k = key(r)
        g = groups.get(k)
        if g is None:
            groups[k] = dataclasses.replace(r, jobs=list(r.jobs))
        else:
            g.add(r)
    return list(groups.values())


# --- the gateway's side --------------------------------------------------------------------------------
def fetch_usage(target: GatewayTarget, request_ids: list[str]) -> tuple[str, dict[str, dict], list[str]]:
    """(the key's project, the ledger rows of its own ids by id, the ids the gateway did not describe),
    in requests of at most MAX_USAGE_IDS ids. DraftsError: the gateway refused or is unreachable."""
    rows: dict[str, dict] = {}
    unknown: list[str] = []
    project = "?"
    for i in range(0, len(request_ids), MAX_USAGE_IDS):
        chunk = request_ids[i : i + MAX_USAGE_IDS]
        try:
            reply = UsageReply.model_validate(post_json(target, USAGE_PATH, {"request_ids": chunk}))
        except ValueError as e:  # not JSON, or not the contract's shape: a gateway of another release
            raise DraftsError(f"the gateway's answer to {USAGE_PATH} is not a usage reply: {e}") from None
        project = reply.project
        rows.update((r.request_id, r.model_dump()) for r in reply.rows)
        unknown += reply.unknown
    return project, rows, unknown


# --- the account -------------------------------------------------------------------------------------
def _runs(store: Store, job_id: int | None, since: date | None) -> list[DraftRun]:
    with Session(store.engine, expire_on_commit=False) as s:
        q = select(DraftRun).order_by(DraftRun.id)
        if job_id is not None:
            q = q.where(DraftRun.job_id == job_id)
        if since is not None:
            q = q.where(DraftRun.created_at >= datetime(since.year, since.month, since.day))
        return list(s.scalars(q))


def _states(store: Store, run_ids: list[int]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    if not run_ids:
        return out
    with Session(store.engine) as s:
        q = (
            select(DraftRow.run_id, DraftRow.state, func.count())
            .where(DraftRow.run_id.in_(run_ids))
            .group_by(DraftRow.run_id, DraftRow.state)
        )
        for run_id, state, n in s.execute(q):
            out.setdefault(run_id, {})[state] = n
    return out


def _environment_changed(store: Store, job_ids: set[int]) -> set[int]:
    """The jobs whose last acceptance found their environment changed since the baseline, in a component
    that changes performance (a `warning` environment anomaly)."""
    if not job_ids:
        return set()
    with Session(store.engine) as s:
        q = select(Anomaly.job_id).where(
            Anomaly.job_id.in_(job_ids), Anomaly.kind == "environment", Anomaly.severity == "warning"
        )
        return set(s.scalars(q))


def _request_ids(run: DraftRun) -> list[str]:
    batch = run.batch if isinstance(run.batch, dict) else {}
    return [str(i) for i in batch.get("request_ids") or () if i]


def _day(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    return (ts if ts.tzinfo is None else ts.astimezone(UTC)).date().isoformat()  # stored naive UTC


def _row(
    run: DraftRun, states: dict[str, int], source: str, calls: list[dict], project: str, ref: dict | None
) -> AccountRow:
    """One run's row: its drafts' states, its compression, and the ledger rows of its calls (none for an
    offline or a farm-side run: the caller sets a farm-side run's own counts). ``ref``: a ledger row of a
    call the run keeps (its own, or an earlier run's that served it from the cache), which names the
    row's date and key."""
    if source == OFFLINE:
        model, key, project = OFFLINE, "-", "-"
    elif source == FARM_SIDE or ref is None:
        model, key, project = run.model or "?", "?", "?"
    else:
        model, key = run.model or ref["model"] or "?", ref["key_id"] or "?"
    row = AccountRow(
        date=ref["date"] if ref is not None and source == GATEWAY else _day(run.created_at),
        task=run.task,
        model=model,
        key=key,
        project=project,
        source=source,
        session=(ref["session_id"] or "") if ref is not None and source == GATEWAY else "",
        jobs=[run.job_id],
        runs=1,
        anomalies=run.anomalies,
        sent=run.sent,
        raw_bytes=run.raw_bytes,
        compressed_bytes=run.compressed_bytes,
        drafts=sum(states.values()),
        accepted=states.get(ACCEPTED, 0),
        rejected=states.get(REJECTED, 0),
        needs_profiler=states.get(NEEDS_PROFILER, 0),
        unreviewed=states.get(NEW, 0),
    )
    for c in calls:
        row.calls += 1
        row.input_tokens += c["input_tokens"]
        row.output_tokens += c["output_tokens"]
        row.cost_usd = _add_cost(row.cost_usd, c["cost_usd"])
        row.retries += c["retries"]
        row.rate_limited += c["rate_limited"]
        row.retry_wait_ms += c["retry_wait_ms"]
        if c["max_tokens"]:
            row.capped_calls += 1
            row.capped_output_tokens += c["output_tokens"]
            row.max_tokens += c["max_tokens"]
            row.peak_output_share = _max(row.peak_output_share, c["output_tokens"] / c["max_tokens"])
    return row


def build_account(
    store: Store,
    job_id: int | None = None,
    since: date | None = None,
    *,
    target: GatewayTarget | None = None,
    use_env: bool = True,
) -> Account:
    """The account of the draft runs of ``job_id`` (all jobs when None) made on or after ``since``.
    ``target`` None with ``use_env`` reads FARM_GATEWAY_URL/KEY; with neither, the gateway is not asked
    and runs that made calls are farm-side."""
    runs = _runs(store, job_id, since)
    states = _states(store, [r.id for r in runs])
    owner: dict[str, int] = {}  # request id -> the first run that keeps it
    for run in runs:
        for rid in _request_ids(run):
            owner.setdefault(rid, run.id)
    ids = list(owner)
    note = None
    project, usage, unknown, read = "?", {}, [], False
    if ids:
        if target is None and use_env:
            target = GatewayTarget.from_settings()
        if target is None:
            note = "no gateway key (FARM_GATEWAY_KEY) is set: the gateway's ledger was not read"
        else:
            try:
                project, usage, unknown = fetch_usage(target, ids)
                read = True
            except DraftsError as e:
                note = f"the gateway's ledger could not be read: {e}"
            if unknown:
                note = (
                    f"{len(unknown)} of {len(ids)} request ids are not in the gateway's ledger for project "
                    f"{project!r} (drafted with another project's key, or not written yet)"
                )
    moved = _environment_changed(store, {r.job_id for r in runs})
    rows = []
    for run in runs:
        kept = _request_ids(run)
        mine = [rid for rid in kept if owner[rid] == run.id]  # the rest are counted in an earlier run
        calls = sorted((usage[rid] for rid in mine if rid in usage), key=lambda c: c["ts"])
        ref = calls[0] if calls else next((usage[rid] for rid in kept if rid in usage), None)
        if not kept:
            source = OFFLINE if run.offline else FARM_SIDE
        else:  # from the ledger when it describes the run's calls (or those that served it from the cache)
            source = GATEWAY if ref is not None else FARM_SIDE
        row = _row(run, states.get(run.id, {}), source, calls, project, ref)
        row.env_changed = int(run.job_id in moved)
        if source == FARM_SIDE and (mine or not kept):  # the run's own counts: its share, as replied
            row.calls = len(mine)
            row.input_tokens, row.output_tokens = run.input_tokens, run.output_tokens
        rows.append(row)
    grouped = rollup(rows, lambda r: (r.date, r.task, r.model, r.key, r.session))
    grouped.sort(key=lambda r: (r.date, r.task, r.model, r.key, r.session))
    counted = [rid for rid in ids if rid in usage] if read else ids
    return Account(grouped, note, counted, sorted(unknown))


# --- the four questions (the account page) -------------------------------------------------------------
def per_accepted_draft(account: Account) -> list[AccountRow]:
    """Tokens per accepted draft, by task and model: which tasks really need a large model."""
    return sorted(rollup(account.rows, lambda r: (r.task, r.model)), key=lambda r: (r.task, r.model))


def per_task(account: Account) -> list[AccountRow]:
    """By task: the compression achieved before sending, and output tokens against the caps asked for."""
    return sorted(rollup(account.rows, lambda r: (r.task,)), key=lambda r: r.task)


def per_key(account: Account) -> list[AccountRow]:
    """Spend by project and key: which key belongs to which project, and what it spent."""
    return sorted(rollup(account.rows, lambda r: (r.project, r.key)), key=lambda r: (r.project, r.key))
