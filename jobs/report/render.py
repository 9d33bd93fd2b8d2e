"""Reports of a job: a terminal table per shape, JSON/CSV exports, and an interactive HTML file
(jobs.report.html, Plotly).

Every row is one trial: median time and spread (IQR over median), speedup over the baseline backend
on the same shape and dtype (same config when the baseline has it), throughput from the family's
cost model, and the correctness result. Throughput is set against the device's limits when the
device is a known GPU; CPU timings are labelled as such.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobs.report.rows import JobReads, Row, build_rows, family_view, fmt_point, speedup_ci
from jobs.report.rows import num as _num
from jobs.report.rows import sig as _sig
from jobs.report.text_table import Cell, TextTable, styled
from jobs.store import Store
from kernels.base import NOT_FAILED, TrialStatus
from kernels.measure.cpu_share import LEVELS

# Row, build_rows and speedup_ci live in jobs.report.rows (the view the HTML pages share); named here too
__all__ = [
    "JobReads",
    "Row",
    "build_rows",
    "render_html",
    "render_summary",
    "render_terminal",
    "speedup_ci",
    "to_csv",
    "to_json",
]


def _styled_status(status: str) -> Cell:
    if status == TrialStatus.OK:
        return status
    return styled(status, "dim" if status in NOT_FAILED else "red")


def _value(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def render_terminal(
    store: Store, job_id: int, console: Console | None = None, reads: JobReads | None = None
) -> None:
    """The job's table per shape; `reads`: what is read of the job, shared with its page (`farm report
    JOB --html`: the trials read and their rows built once)."""
    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 140)
    reads = reads or JobReads(store, job_id)
    job = reads.job
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    rows = reads.rows
    envs = reads.environments
    console.print(
        f"[bold]job {job.id}[/bold] {job.name} ({job.family}) status {job.status}, "
        f"kernels {job.git_commit or 'unknown commit'}"
    )
    for e in envs:
        label = "CPU timings" if e.device_kind == "cpu" else "GPU timings"
        console.print(
            f"  {label} on {e.host}: {e.device_name} (torch {e.data.get('torch')}, "
            f"triton {e.data.get('triton')}, ray {e.data.get('ray')})"
        )
    _print_levels(rows, console)
    show_config = any(r.config != "-" for r in rows)
    dtypes = sorted({r.dtype for r in rows})
    cols = ["backend"] + (["config"] if show_config else []) + (["dtype"] if len(dtypes) > 1 else [])
    extra = [
        (key, label, fmt)
        for key, label, fmt in family_view(job.family)[0]
        if any(key in r.extra for r in rows)
    ]
    cols += ["status", "median ms", "spread", "n", "stop", "speedup", "TFLOPS", "GB/s"]
    cols += [label for _key, label, _fmt in extra] + ["correct", "node"]
    if not console.is_terminal:  # a file or a pipe: wide enough that no column is cut
        console.width = max(console.width, 14 * len(cols) + 20)
    right = set(cols) - {"backend", "config", "dtype", "status"}
    # one pass over the rows (a job of 250 shapes is not read 250 times), tables drawn by TextTable
    by_shape: dict[str, list[Row]] = {}
    for r in rows:
        by_shape.setdefault(r.shape, []).append(r)
    correct = {True: styled("pass", "green"), False: styled("FAIL", "red"), None: "-"}
    for shape, mine in by_shape.items():
        title = f"shape {shape}" + (f" ({dtypes[0]})" if len(dtypes) == 1 else "")
        table = TextTable(cols, right, title=title)
        for r in mine:
            stop = r.stop_reason or "-"
            values = {
                "backend": r.backend + (" (base)" if r.baseline else ""),
                "config": r.config,
                "dtype": r.dtype,
                "status": _styled_status(r.status),
                "median ms": _num(r.median_ms, ".4f"),
                "spread": _num(r.spread_pct, ".1f") + ("%" if r.spread_pct is not None else ""),
                "n": _num(r.n, "d"),
                "stop": Text.assemble(stop, (f" {r.flags}", "yellow")) if r.flags else stop,
                "speedup": _num(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
                "TFLOPS": _sig(r.tflops),
                "GB/s": _sig(r.gbps),
                "correct": correct[r.correct],
                "node": r.node or "-",
                **{label: _value(r.extra.get(key), fmt) for key, label, fmt in extra},
            }
            table.add_row(*(values[c] for c in cols))
        console.print(table)
    for r in rows:
        if r.error:
            console.print(f"[red]trial {r.trial} {r.backend} {r.shape} {r.status}:[/red] {r.error}")
    from jobs.drafts.client import render_drafts  # the agent acceptance layer's drafts, next to the anomalies

    render_drafts(store, job_id, console)


def _print_levels(rows: list, console: Console) -> None:
    """Which level the CPU timings used (kernels.measure.cpu_share), and the share of a core they got."""
    levels = sorted({r.level for r in rows if r.level})
    shares = [r.core_share for r in rows if r.core_share is not None]
    if not levels:
        return
    got = f"; the timed calls got {min(shares):.0%} to {max(shares):.0%} of a core" if shares else ""
    console.print(f"  CPU level: {' and '.join(LEVELS.get(v, v) for v in levels)}{got}")


def to_json(store: Store, job_id: int) -> str:
    return json.dumps([asdict(r) for r in build_rows(store, job_id)], indent=2)


def to_csv(store: Store, job_id: int) -> str:
    rows = [asdict(r) for r in build_rows(store, job_id)]
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


# ---- HTML ------------------------------------------------------------------------------------------


def render_html(store: Store, job_id: int, reads: JobReads | None = None) -> str:
    """The job's interactive report, one self-contained file (jobs.report.html); `reads`: what was read
    of the job already (render_terminal's)."""
    from jobs.report.html import render_job

    return render_job(store, job_id, reads=reads)


# ---- the compact summary a sweep ends with ------------------------------------------------------------

_WORST = {
    "fail": 3,
    "ambiguous": 2,
    "pass": 1,
}  # a shape's verdict: its worst assertion outcome (skips aside)


def render_summary(store: Store, job_id: int, console: Console, acc: Any = None) -> None:
    """One line per shape: the baseline, the fastest correct trial, its speedup with a 95% interval and,
    when the job was judged (``acc``: a jobs.judge.acceptance result), the shape's worst assertion."""
    rows = build_rows(store, job_id)
    ids = {t.seq: t.id for t in store.trials(job_id)}
    verdicts: dict[str, str] = {}
    for r in getattr(acc, "results", ()):
        shape = fmt_point(r.trial.shape)
        if _WORST.get(r.outcome, 0) > _WORST.get(verdicts.get(shape, ""), 0):
            verdicts[shape] = r.outcome
    table = Table(title=f"summary of job {job_id}", title_justify="left")
    for col in ("shape", "baseline ms", "best", "best ms", "speedup [95% CI]") + (
        ("verdict",) if acc else ()
    ):
        table.add_column(col, justify="left" if col in ("shape", "best", "verdict") else "right")
    for shape in dict.fromkeys(r.shape for r in rows):
        timed = [r for r in rows if r.shape == shape and r.status == TrialStatus.OK and r.median_ms]
        base = next((r for r in timed if r.baseline), None)
        best = min(timed, key=lambda r: r.median_ms, default=None)
        speed = "-"
        if base is not None and best is not None and best is not base:
            ci = speedup_ci(store, ids[base.trial], ids[best.trial])
            if ci is not None:
                speed = f"{_sig(ci[0])}x [{_sig(ci[1])}, {_sig(ci[2])}]"
        elif best is base and base is not None:
            speed = "1x (the baseline is fastest)"
        cells = [
            shape,
            _num(base.median_ms, ".4g") if base else "-",
            (best.backend + (f" {best.config}" if best.config != "-" else "")) if best else "-",
            _num(best.median_ms, ".4g") if best else "-",
            speed,
        ]
        if acc:
            v = verdicts.get(shape, "pass")
            cells.append({"fail": "[red]fail[/red]", "ambiguous": "[yellow]ambiguous[/yellow]"}.get(v, v))
        table.add_row(*cells)
    console.print(table)
