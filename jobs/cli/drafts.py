"""`farm drafts`: the review of the drafts `farm accept --drafts` stored. List them, run a draft's check
on its job, accept, reject or mark one as needing a profiler, and promote an accepted one's check into a
metric card (jobs.drafts.review)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from jobs.cli.common import console, db_option, echo, require_job, store_for
from jobs.errors import BadInput


@click.group("drafts")
def drafts() -> None:
    """Review the drafts of a job's anomalies; promote the accepted ones into the metric card."""


def _check_text(spec: dict | None, error: str | None) -> str:
    if spec is None:
        return f"invalid: {error}" if error else "-"
    scope = spec.get("scope") or {}
    parts = [f"{k}={v}" for k, v in scope.items() if k not in ("family", "shapes")]
    parts += [
        "shape " + ",".join(f"{k}={v}" for k, v in shape.items()) for shape in scope.get("shapes") or ()
    ]
    where = ", ".join(parts)
    return f"{spec['metric']} {spec['op']} {spec['threshold']:g}" + (f" on {where}" if where else "")


@drafts.command("list")
@click.argument("job_id", type=int, required=False)
@click.option("--json", "as_json", is_flag=True, help="print the drafts as JSON instead of a table")
@db_option
def drafts_list(job_id: int | None, as_json: bool, db: str | None) -> None:
    """Drafts with their ids, review state, job and the anomalies they came from, by kind and fingerprint
    (all jobs, or JOB_ID's)."""
    from jobs.drafts.review import list_drafts

    store = store_for(db, create=False)
    if job_id is not None:
        require_job(store, job_id)
    rows = list_drafts(store, job_id)
    if as_json:
        keys = ("id", "job_id", "state", "reason", "fingerprints", "assertion", "verify_how")
        keys += ("failure_signature", "needs_local_profiler", "check_spec", "check_error", "promoted_to")
        click.echo(json.dumps([{k: getattr(r, k) for k in keys} for r in rows], indent=2, default=str))
        return
    if not rows:
        echo(
            "no drafts" + (f" for job {job_id}" if job_id is not None else "") + " (farm accept JOB --drafts)"
        )
        return
    kinds: dict[tuple[int, str], str] = {}  # (job, fingerprint) -> the anomaly's kind, what the table shows
    for job in {r.job_id for r in rows}:
        kinds |= {(job, a.fingerprint): a.kind for a in store.anomalies(job)}
    table = Table(show_lines=True)
    for col in ("id", "job", "state", "anomalies", "assertion", "check", "profiler"):
        table.add_column(col, overflow="fold")
    for r in rows:
        state = (
            r.state
            + (f": {r.reason}" if r.reason else "")
            + (f"\npromoted to {r.promoted_to}" if r.promoted_to else "")
        )
        table.add_row(
            str(r.id),
            str(r.job_id),
            escape(state),
            "\n".join(f"{kinds.get((r.job_id, fp), '?')} {fp[:12]}" for fp in r.fingerprints),
            escape(r.assertion),
            escape(_check_text(r.check_spec, r.check_error)),
            "yes" if r.needs_local_profiler else "no",
        )
    console().print(table)


@drafts.command("review")
@click.argument("draft_id", type=int)
@click.option("--accept", "verdict", flag_value="accepted", help="the draft holds: it may be promoted")
@click.option("--reject", "verdict", flag_value="rejected", help="the draft does not hold: not drafted again")
@click.option(
    "--needs-profiler", "verdict", flag_value="needs_profiler", help="only a local profiler decides it"
)
@click.option("--reason", default=None, help="why (kept with the draft)")
@db_option
def drafts_review(draft_id: int, verdict: str | None, reason: str | None, db: str | None) -> None:
    """Accept, reject or mark DRAFT_ID as needing a local profiler."""
    from jobs.drafts.review import ReviewError, review

    if verdict is None:
        raise BadInput("say one of --accept, --reject or --needs-profiler")
    try:
        row = review(store_for(db, create=True), draft_id, verdict, reason)
    except ReviewError as err:
        raise BadInput(str(err)) from None
    click.echo(f"draft {row.id} (job {row.job_id}): {row.state}" + (f" ({row.reason})" if row.reason else ""))


@drafts.command("check")
@click.argument("draft_id", type=int)
@click.option("--job", "job_id", type=int, default=None, help="run it on this job (default: the draft's own)")
@db_option
def drafts_check(draft_id: int, job_id: int | None, db: str | None) -> None:
    """Run DRAFT_ID's check on its job's trials; exit 1 when it does not hold there."""
    from jobs.drafts.review import ReviewError, check_on_job
    from jobs.spec.cards import CardError

    store = store_for(db, create=False)
    if job_id is not None:
        require_job(store, job_id)
    try:
        run = check_on_job(store, draft_id, job_id)
    except (ReviewError, CardError, LookupError, ValueError) as err:
        raise BadInput(str(err)) from None
    table = Table()
    for col in ("trial", "outcome", "reason"):
        table.add_column(col, overflow="fold")
    for r in run.results:
        table.add_row(escape(r.label), r.outcome, escape(r.result.reason))
    out = console()
    out.print(table)
    where = f"job {job_id}" if job_id is not None else "its job"
    if not run.results:
        verdict = "no trial is in its scope"
    else:
        verdict = (
            "holds" if run.holds else "does not hold" if run.counts.get("fail") else "could not be judged"
        )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(run.counts.items())) or "none"
    out.print(f"draft {draft_id}: {run.check.text()} {verdict} on {where} ({counts})")
    sys.exit(0 if run.holds else 1)


@drafts.command("promote")
@click.argument("draft_id", type=int)
@click.option("--card", "card_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the metric card's YAML file (e.g. jobs/cards/gemm.yaml)")  # fmt: skip
@db_option
def drafts_promote(draft_id: int, card_path: Path, db: str | None) -> None:
    """Write accepted DRAFT_ID's check into a metric card; `farm accept` enforces it from then on."""
    from jobs.drafts.review import ReviewError, promote
    from jobs.spec.cards import CardError

    try:
        chk = promote(store_for(db, create=True), draft_id, card_path)
    except (ReviewError, CardError) as err:
        raise BadInput(str(err)) from None
    click.echo(f"{card_path}: added {chk.name}: {chk.text()}; `farm accept` enforces it from now on")


ACCOUNT_COLUMNS = (  # (heading, AccountRow field or property) of the table and the CSV's first columns
    ("date", "date"), ("task", "task"), ("model", "model"), ("key", "key"), ("session", "session"),
    ("calls", "calls"),
    ("input", "input_tokens"), ("output", "output_tokens"), ("total", "total_tokens"), ("cost $", "cost_usd"),
    ("retries", "retries"), ("429s", "rate_limited"), ("retry wait s", "retry_wait_ms"),
    ("conclusion", "conclusion"), ("source", "source"),
)  # fmt: skip


TEXT_COLUMNS = {"date", "task", "model", "key", "session", "conclusion", "source"}


def _account_cell(name: str, value: object) -> str:
    if value is None:
        return "-"
    if name == "cost_usd":
        return f"{value:.4f}"
    if name == "retry_wait_ms":
        return f"{value / 1000:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


@drafts.command("account")
@click.argument("job_id", type=int, required=False)
@click.option("--since", default=None, help="only draft runs made on or after this day (YYYY-MM-DD, UTC)")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)
@db_option
def drafts_account(job_id: int | None, since: str | None, fmt: str, db: str | None) -> None:
    """The token account: per date, task, model, gateway key and agent session, the calls the draft runs
    made, their tokens, cost, retries, upstream 429s and retry wait (from the gateway's ledger, asked with
    FARM_GATEWAY_KEY), and the conclusion of the drafts they produced ("pass 5/6, 1 awaiting the
    profiler"). Offline drafts are model "offline" with no tokens; when the gateway cannot be read, the
    farm's own counts are shown, marked farm-side."""
    import csv
    from datetime import date

    from jobs.drafts.account import build_account

    try:
        day = date.fromisoformat(since) if since else None
    except ValueError:
        raise BadInput(f"--since: {since!r} is not a day (YYYY-MM-DD)") from None
    store = store_for(db, create=False)
    if job_id is not None:
        require_job(store, job_id)
    account = build_account(store, job_id, day)
    if account.note:
        echo(f"note: {account.note}")
    if fmt == "json":
        click.echo(json.dumps(account.as_dict(), indent=2))
        return
    if fmt == "csv":
        named = [f for _, f in ACCOUNT_COLUMNS]
        fields = named + [k for k in account.totals().as_dict() if k not in named]
        out = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        out.writeheader()
        for r in account.rows:
            out.writerow(
                {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in r.as_dict().items()}
            )
        return
    if not account.rows:
        echo(
            "no draft runs"
            + (f" for job {job_id}" if job_id is not None else "")
            + " (farm accept JOB --drafts)"
        )
        return
    table = Table()
    for head, _ in ACCOUNT_COLUMNS:
        table.add_column(head, overflow="fold", justify="left" if head in TEXT_COLUMNS else "right")
    for r in account.rows:
        table.add_row(*(escape(_account_cell(f, getattr(r, f))) for _, f in ACCOUNT_COLUMNS))
    table.add_section()
    total = account.totals()
    table.add_row(
        "total",
        "",
        "",
        "",
        "",
        *(escape(_account_cell(f, getattr(total, f))) for _, f in ACCOUNT_COLUMNS[5:-1]),
        "",
    )
    console().print(table)
