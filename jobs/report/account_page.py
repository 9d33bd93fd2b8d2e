"""`account.html` of `farm site`: the token account of the drafts (jobs.drafts.account) and the four
questions it is kept for, each a table:

1. tokens per accepted draft, by task and model (which tasks really need a large model);
2. input compression per task (the bytes of log and evidence the anomalies stood for against the
   fixed-format summary sent, and the input tokens per anomaly sent: which inputs can be compressed further);
3. output tokens against ``max_tokens`` per task (the share of the cap the calls used: which outputs can be
   constrained);
4. keys and projects with their spend.

Rendered from templates/account.html.j2 like the other pages (their base and tables); no plot, so no
plotly.js.
"""

from __future__ import annotations

from jobs.drafts.account import Account, AccountRow, per_accepted_draft, per_key, per_task
from jobs.report.rows import num
from jobs.report.templating import render_page
from jobs.report.views import Link, Table


def _int(v: int) -> str:
    return f"{v:,}"


def _ints(r: AccountRow, *names: str) -> list[str]:
    """The row's counts `names`, each with thousands separators."""
    return [_int(getattr(r, name)) for name in names]


def _cost(v: float | None) -> str:
    return num(v, ".4f")


def _ratio(a: float, b: float, fmt: str = ".1f") -> str:
    return format(a / b, fmt) if b else "-"


def _source_text(account: Account) -> str:
    """Where the account's numbers come from, as a sentence."""
    sources = account.sources
    parts = []
    if "gateway" in sources or "mixed" in sources:
        parts.append(
            f"tokens, cost, retries and 429s read from the gateway's ledger for {len(account.request_ids)} "
            "request ids the draft runs keep"
        )
    if "farm-side" in sources or "mixed" in sources:
        parts.append("rows marked farm-side show the farm's own token counts (no cost, retries or 429s)")
    if "offline" in sources:
        parts.append("offline rows were drafted in-process by the offline drafter: no model call, no tokens")
    text = "; ".join(parts) or "no draft run yet (farm accept JOB --drafts)"
    return f"{text[0].upper() + text[1:]}."


SPEND = ["calls", "input", "output", "total", "cost $", "retries", "429s", "retry wait s"]


def _spend(r: AccountRow) -> list[str]:
    """A row's calls, tokens, cost, retries, 429s and retry wait: the SPEND columns."""
    return [
        *_ints(r, "calls", "input_tokens", "output_tokens", "total_tokens"),
        _cost(r.cost_usd),
        *_ints(r, "retries", "rate_limited"),
        f"{r.retry_wait_ms / 1000:.2f}",
    ]


def _account_table(account: Account) -> Table:
    head = ["date", "task", "model", "key", *SPEND, "conclusion", "source"]
    rows = [*account.rows, account.totals()] if account.rows else []
    body = [
        [
            r.date,
            r.task,
            r.model,
            r.key,
            *_spend(r),
            r.conclusion,
            r.source,
        ]  # fmt: skip
        for r in rows
    ]
    return Table(head, body, left=4)


def _per_accepted(rows: list[AccountRow]) -> Table:
    head = ["task", "model", "calls", "total tokens", "cost $", "drafts", "accepted", "tokens per accepted"]
    head += ["cost $ per accepted", "conclusion"]
    body = [
        [
            r.task,
            r.model,
            _int(r.calls),
            _int(r.total_tokens),
            _cost(r.cost_usd),
            _int(r.drafts),
            _int(r.accepted),
            _ratio(r.total_tokens, r.accepted, ",.0f"),
            "-" if r.cost_usd is None or not r.accepted else f"{r.cost_usd / r.accepted:.4f}",
            r.conclusion,
        ]  # fmt: skip
        for r in rows
    ]
    return Table(head, body, left=2)


def _compression(rows: list[AccountRow]) -> Table:
    head = ["task", "runs", "anomalies", "sent (repeats folded)", "log and evidence B", "summary sent B"]
    head += ["compression", "input tokens", "input tokens per anomaly sent"]
    body = [
        [
            r.task,
            *_ints(r, "runs", "anomalies", "sent", "raw_bytes", "compressed_bytes"),
            f"{_ratio(r.raw_bytes, r.compressed_bytes)}x",
            _int(r.input_tokens),
            _ratio(r.input_tokens, r.sent, ",.0f"),
        ]  # fmt: skip
        for r in rows
    ]
    return Table(head, body)


def _outputs(rows: list[AccountRow]) -> Table:
    head = ["task", "calls", "calls with max_tokens", "their output tokens", "their max_tokens"]
    head += ["share of the cap used", "largest share in one call", "output tokens, all calls"]
    body = [
        [
            r.task,
            *_ints(r, "calls", "capped_calls", "capped_output_tokens", "max_tokens"),
            _ratio(r.capped_output_tokens * 100, r.max_tokens, ".0f") + ("%" if r.max_tokens else ""),
            "-" if r.peak_output_share is None else f"{r.peak_output_share:.0%}",
            _int(r.output_tokens),
        ]  # fmt: skip
        for r in rows
    ]
    return Table(head, body)


def _keys(rows: list[AccountRow]) -> Table:
    head = ["project", "key", *SPEND, "jobs"]
    body = [
        [
            r.project,
            r.key,
            *_spend(r),
            ", ".join(map(str, r.jobs)),
        ]  # fmt: skip
        for r in rows
    ]
    return Table(head, body, left=2)


def render_account(account: Account, nav: tuple[Link, ...] = ()) -> str:
    """The account page: the account's rows with their totals, then the four questions."""
    tasks = per_task(account)
    return render_page(
        "account.html.j2",
        "Token account",
        plotly=False,
        nav=nav,
        sources=_source_text(account),
        note=account.note,
        rows=_account_table(account),
        per_accepted=_per_accepted(per_accepted_draft(account)),
        compression=_compression(tasks),
        outputs=_outputs(tasks),
        keys=_keys(per_key(account)),
    )
