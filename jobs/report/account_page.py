"""`account.html` of `farm site`: the token account of the drafts (jobs.drafts.account) and the four
questions it is kept for, each a table:

1. tokens per accepted draft, by task and model (which tasks really need a large model);
2. input compression per task (the bytes of log and evidence the anomalies stood for against the
   fixed-format summary sent, and the input tokens per anomaly sent: which inputs can be compressed further);
3. output tokens against ``max_tokens`` per task (the share of the cap the calls used: which outputs can be
   constrained);
4. keys and projects with their spend.

Plain HTML like the other pages (jobs.report.html's page and table); no plot, so no plotly.js.
"""

from __future__ import annotations

import html

from jobs.drafts.account import Account, AccountRow, per_accepted_draft, per_key, per_task
from jobs.report.html import page, table

esc = html.escape


def _int(v: int) -> str:
    return f"{v:,}"


def _cost(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _ratio(a: float, b: float, fmt: str = ".1f") -> str:
    return format(a / b, fmt) if b else "-"


def _source_text(account: Account) -> str:
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
    note = f"<p><b>Note:</b> {esc(account.note)}</p>" if account.note else ""
    return f"<p>{esc(text[0].upper() + text[1:])}.</p>{note}"


def _account_table(account: Account) -> str:
    head = ["date", "task", "model", "key", "calls", "input", "output", "total", "cost $", "retries"]
    head += ["429s", "retry wait s", "conclusion", "source"]
    rows = [*account.rows, account.totals()] if account.rows else []
    body = [
        [
            r.date,
            r.task,
            r.model,
            r.key,
            _int(r.calls),
            _int(r.input_tokens),
            _int(r.output_tokens),
            _int(r.total_tokens),
            _cost(r.cost_usd),
            _int(r.retries),
            _int(r.rate_limited),
            f"{r.retry_wait_ms / 1000:.2f}",
            r.conclusion,
            r.source,
        ]  # fmt: skip
        for r in rows
    ]
    return table(head, body, left=4)


def _per_accepted(rows: list[AccountRow]) -> str:
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
    return table(head, body, left=2)


def _compression(rows: list[AccountRow]) -> str:
    head = ["task", "runs", "anomalies", "sent (repeats folded)", "log and evidence B", "summary sent B"]
    head += ["compression", "input tokens", "input tokens per anomaly sent"]
    body = [
        [
            r.task,
            _int(r.runs),
            _int(r.anomalies),
            _int(r.sent),
            _int(r.raw_bytes),
            _int(r.compressed_bytes),
            f"{_ratio(r.raw_bytes, r.compressed_bytes)}x",
            _int(r.input_tokens),
            _ratio(r.input_tokens, r.sent, ",.0f"),
        ]  # fmt: skip
        for r in rows
    ]
    return table(head, body)


def _outputs(rows: list[AccountRow]) -> str:
    head = ["task", "calls", "calls with max_tokens", "their output tokens", "their max_tokens"]
    head += ["share of the cap used", "largest share in one call", "output tokens, all calls"]
    body = [
        [
            r.task,
            _int(r.calls),
            _int(r.capped_calls),
            _int(r.capped_output_tokens),
            _int(r.max_tokens),
            _ratio(r.capped_output_tokens * 100, r.max_tokens, ".0f") + ("%" if r.max_tokens else ""),
            "-" if r.peak_output_share is None else f"{r.peak_output_share:.0%}",
            _int(r.output_tokens),
        ]  # fmt: skip
        for r in rows
    ]
    return table(head, body)


def _keys(rows: list[AccountRow]) -> str:
    head = ["project", "key", "calls", "input", "output", "total", "cost $", "retries", "429s"]
    head += ["retry wait s", "jobs"]
    body = [
        [
            r.project,
            r.key,
            _int(r.calls),
            _int(r.input_tokens),
            _int(r.output_tokens),
            _int(r.total_tokens),
            _cost(r.cost_usd),
            _int(r.retries),
            _int(r.rate_limited),
            f"{r.retry_wait_ms / 1000:.2f}",
            ", ".join(map(str, r.jobs)),
        ]  # fmt: skip
        for r in rows
    ]
    return table(head, body, left=2)


def render_account(account: Account, links: str = "") -> str:
    """The account page: the account's rows with their totals, then the four questions."""
    tasks = per_task(account)
    body = (
        f"{links}<h1>Token account of the drafts</h1>"
        + _source_text(account)
        + "<h2>Per date, task, model and key</h2>"
        + "<p>Conclusion: accepted drafts out of all the runs' drafts, then those awaiting a local profiler, "
        "rejected and not yet reviewed (<code>farm drafts review</code>).</p>"
        + _account_table(account)
        + "<h2>1. Tokens per accepted draft, by task and model</h2>"
        + "<p>Which tasks need a large model: a smaller model with as many accepted drafts costs less per "
        "accepted draft.</p>"
        + _per_accepted(per_accepted_draft(account))
        + "<h2>2. Input compression per task</h2>"
        + "<p>The log and evidence bytes the anomalies stood for against the fixed-format summary sent; "
        "repeats of one anomaly are folded before sending. Many input tokens per anomaly sent: an input "
        "that can be compressed further.</p>"
        + _compression(tasks)
        + "<h2>3. Output tokens against max_tokens per task</h2>"
        + "<p>The share of the output cap the calls used (from the ledger's max_tokens): a task whose "
        "largest share stays well below 100% can be given a lower cap.</p>"
        + _outputs(tasks)
        + "<h2>4. Keys and projects with their spend</h2>"
        + _keys(per_key(account))
    )
    return page("Token account", body, plotly_src="plotly.min.js")
