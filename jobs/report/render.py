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
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from jobs.store import Store
from kernels.base import NOT_FAILED, TrialStatus
from kernels.registry import get_family


@dataclass
class Row:
    trial: int
    shape: str
    backend: str
    baseline: bool
    config: str
    dtype: str
    status: str
    attempt: int
    median_ms: float | None
    spread_pct: float | None  # IQR / median
    cv_pct: float | None
    n: int | None
    stop_reason: str | None
    flags: str  # the measurement's flags (noisy, throttled, step, few_samples), comma-separated
    speedup: float | None  # baseline median / this median
    tflops: float | None
    gbps: float | None
    correct: bool | None
    max_abs_err: float | None
    node: str | None
    gpu_id: str | None
    timer: str | None
    error: str | None
    extra: dict[str, Any] = field(default_factory=dict)  # the family's report_metrics
    p10_ms: float | None = None
    p90_ms: float | None = None


def _family_view(family: str) -> tuple[tuple, tuple]:
    """(report_metrics, scaling) the family declares; none when it declares none or cannot be imported."""
    try:
        fam = get_family(family)
    except Exception:  # noqa: BLE001 - a report must render even for a family no longer installed
        return (), ()
    return tuple(fam.report_metrics), tuple(fam.scaling)


def _fmt_point(point: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items()) or "-"


def build_rows(store: Store, job_id: int) -> list[Row]:
    trials = store.trials(job_id)
    extra_keys = [key for key, _label, _fmt in _family_view(trials[0].family)[0]] if trials else []
    base: dict[tuple, dict[str, float]] = {}
    for t in trials:
        if t.baseline and t.status == TrialStatus.OK and t.median_ns:
            key = (_fmt_point(t.shape), t.dtype)
            base.setdefault(key, {})[_fmt_point(t.config)] = t.median_ns
    rows = []
    for t in trials:
        s = t.stats
        m = t.metrics or {}
        c = t.correctness or {}
        median = t.median_ns
        speedup = None
        candidates = base.get((_fmt_point(t.shape), t.dtype), {})
        # the baseline on the same config; another config only when the baseline has just one
        ref = candidates.get(_fmt_point(t.config))
        if ref is None and len(candidates) == 1:
            ref = next(iter(candidates.values()))
        if ref and median:
            speedup = ref / median
        rows.append(
            Row(
                trial=t.seq,
                shape=_fmt_point(t.shape),
                backend=t.backend,
                baseline=t.baseline,
                config=_fmt_point(t.config),
                dtype=(t.metrics or {}).get("compute_dtype")
                or t.dtype,  # what ran (a bf16 backend on fp32 inputs)
                status=t.status,
                attempt=t.attempt,
                median_ms=median / 1e6 if median else None,
                spread_pct=100 * s.iqr / median if median and s.iqr is not None else None,
                cv_pct=100 * s.cv if s.cv is not None else None,
                n=s.n if t.summary is not None else None,
                stop_reason=t.stop_reason,
                flags=",".join(s.flags),
                speedup=speedup,
                tflops=m.get("tflops"),
                gbps=m.get("gbps"),
                correct=t.correct,
                max_abs_err=c.get("max_abs_err"),
                node=t.node,
                gpu_id=t.gpu_id,
                timer=t.timer,
                error=(t.error or "").strip().splitlines()[-1][:200] if t.error else None,
                extra={k: m[k] for k in extra_keys if k in m},
                p10_ms=s.p10 / 1e6 if s.p10 is not None else None,
                p90_ms=s.p90 / 1e6 if s.p90 is not None else None,
            )
        )
    return rows


def _styled_status(status: str) -> str:
    if status == TrialStatus.OK:
        return status
    return f"[dim]{status}[/dim]" if status in NOT_FAILED else f"[red]{status}[/red]"


def _value(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _sig(v: float | None, digits: int = 3) -> str:
    """Significant digits, never a bare `0.000` for a small rate (CPU TFLOPS): 0.00123, 45.6, 1234."""
    if v is None:
        return "-"
    if v == 0 or abs(v) >= 10 ** (digits - 1):
        return f"{v:.0f}"
    return f"{v:#.{digits}g}".rstrip(".")


def render_terminal(store: Store, job_id: int, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 140)
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    rows = build_rows(store, job_id)
    envs = store.environments(job_id)
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
    show_config = any(r.config != "-" for r in rows)
    dtypes = sorted({r.dtype for r in rows})
    cols = ["backend"] + (["config"] if show_config else []) + (["dtype"] if len(dtypes) > 1 else [])
    extra = [
        (key, label, fmt)
        for key, label, fmt in _family_view(job.family)[0]
        if any(key in r.extra for r in rows)
    ]
    cols += ["status", "median ms", "spread", "n", "stop", "speedup", "TFLOPS", "GB/s"]
    cols += [label for _key, label, _fmt in extra] + ["correct", "node"]
    if not console.is_terminal:  # a file or a pipe: wide enough that no column is cut
        console.width = max(console.width, 14 * len(cols) + 20)
    for shape in dict.fromkeys(r.shape for r in rows):
        table = Table(
            title=f"shape {shape}" + (f" ({dtypes[0]})" if len(dtypes) == 1 else ""), title_justify="left"
        )
        for col in cols:
            table.add_column(
                col, justify="left" if col in ("backend", "config", "dtype", "status") else "right"
            )
        for r in (r for r in rows if r.shape == shape):
            values = {
                "backend": r.backend + (" (base)" if r.baseline else ""),
                "config": r.config,
                "dtype": r.dtype,
                "status": _styled_status(r.status),
                "median ms": _num(r.median_ms, ".4f"),
                "spread": _num(r.spread_pct, ".1f") + ("%" if r.spread_pct is not None else ""),
                "n": _num(r.n, "d"),
                "stop": (r.stop_reason or "-") + (f" [yellow]{r.flags}[/yellow]" if r.flags else ""),
                "speedup": _num(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
                "TFLOPS": _sig(r.tflops),
                "GB/s": _sig(r.gbps),
                "correct": {True: "[green]pass[/green]", False: "[red]FAIL[/red]", None: "-"}[r.correct],
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


def render_html(store: Store, job_id: int) -> str:
    """The job's interactive report, one self-contained file (jobs.report.html)."""
    from jobs.report.html import render_job

    return render_job(store, job_id)


# ---- the compact summary a sweep ends with ------------------------------------------------------------

_WORST = {
    "fail": 3,
    "ambiguous": 2,
    "pass": 1,
}  # a shape's verdict: its worst assertion outcome (skips aside)


def speedup_ci(store: Store, base_trial_id: int, trial_id: int) -> tuple[float, float, float] | None:
    """(baseline median / median, low, high): a speedup with a 95% bootstrap interval over both trials'
    kept samples; None when either has none."""
    import numpy as np

    from kernels.measure.stats import bootstrap_ratio_ci

    a = np.asarray(store.kept_samples(base_trial_id), dtype=float)
    b = np.asarray(store.kept_samples(trial_id), dtype=float)
    if len(a) == 0 or len(b) == 0:
        return None
    lo, hi = bootstrap_ratio_ci(a, b, n_boot=400, confidence=0.95, seed=0)  # of b/a: inverted below
    return (
        float(np.median(a) / np.median(b)),
        (1 / hi if hi else float("nan")),
        (1 / lo if lo else float("nan")),
    )


def render_summary(store: Store, job_id: int, console: Console, acc: Any = None) -> None:
    """One line per shape: the baseline, the fastest correct trial, its speedup with a 95% interval and,
    when the job was judged (``acc``: a jobs.judge.acceptance result), the shape's worst assertion."""
    rows = build_rows(store, job_id)
    ids = {t.seq: t.id for t in store.trials(job_id)}
    verdicts: dict[str, str] = {}
    for r in getattr(acc, "results", ()):
        shape = _fmt_point(r.trial.shape)
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
