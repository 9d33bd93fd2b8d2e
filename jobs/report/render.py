"""Reports of a job: a terminal table per shape, JSON/CSV exports, and an HTML file with plots.

Every row is one trial: median time and spread (IQR over median), speedup over the baseline backend
on the same shape and dtype (same config when the baseline has it), throughput from the family's
cost model, and the correctness result. Throughput is set against the device's limits when the
device is a known GPU; CPU timings are labelled as such.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from jobs.store.repository import Store
from kernels.base import NOT_FAILED, TrialStatus
from kernels.hardware import limits_for
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


def _family_view(family: str) -> tuple[tuple, tuple]:
    """(report_metrics, scaling) the family declares; none when it declares none or cannot be imported."""
    try:
        fam = get_family(family)
    except Exception:  # noqa: BLE001 - a report must render even for a family no longer installed
        return (), ()
    return tuple(getattr(fam, "report_metrics", ())), tuple(getattr(fam, "scaling", ()))


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
        s = t.summary or {}
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
                dtype=t.dtype,
                status=t.status,
                attempt=t.attempt,
                median_ms=median / 1e6 if median else None,
                spread_pct=100 * s["iqr"] / median if median and s.get("iqr") is not None else None,
                cv_pct=100 * s["cv"] if s.get("cv") is not None else None,
                n=s.get("n"),
                stop_reason=t.stop_reason,
                flags=",".join(s.get("flags") or []),
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
                "TFLOPS": _num(r.tflops, ".3f"),
                "GB/s": _num(r.gbps, ".2f"),
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


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _timeseries_plots(plt: Any, series: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """One figure per trial that recorded metrics["timeseries"] = {xlabel, x, series: {name: ys}, title}."""
    out = []
    for label, ts in series:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for name, ys in ts.get("series", {}).items():
            ax.plot(ts["x"][: len(ys)], ys, label=name)
        ax.set_xlabel(ts.get("xlabel", ""))
        ax.legend(fontsize=7)
        out.append((f"{ts.get('title', 'Time series')} ({label})", _png(fig)))
        plt.close(fig)
    return out


def _scaling_plots(plt: Any, scaling: list[tuple[str, str, list[Any]]]) -> list[tuple[str, str]]:
    """One figure per declared (shape key, metric): a line per backend/config and other shape keys."""
    out = []
    for x_key, metric, trials in scaling:
        lines: dict[str, list[tuple[float, float]]] = {}
        for t in trials:
            y = (t.metrics or {}).get(metric)
            if t.status != TrialStatus.OK or x_key not in t.shape or not isinstance(y, int | float):
                continue
            rest = " ".join(f"{k}={v}" for k, v in t.shape.items() if k != x_key)
            label = f"{t.backend} {_fmt_point(t.config) if t.config else ''} {rest}".strip()
            lines.setdefault(label, []).append((t.shape[x_key], y))
        lines = {k: sorted(v) for k, v in lines.items() if len(v) > 1}
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(9, 4))
        for label, points in lines.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x_key)
        ax.set_ylabel(metric)
        ax.legend(fontsize=6)
        out.append((f"{metric} against {x_key}", _png(fig)))
        plt.close(fig)
    return out


def _plots(
    rows: list[Row],
    device_name: str | None,
    trials_series: list[tuple[str, dict[str, Any]]],
    scaling: list[tuple[str, str, list[Any]]] = (),
) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.median_ms]
    out: list[tuple[str, str]] = []
    if not timed:
        return _timeseries_plots(plt, trials_series) + _scaling_plots(plt, list(scaling))
    shapes = list(dict.fromkeys(r.shape for r in timed))

    fig, ax = plt.subplots(figsize=(9, 0.35 * len(timed) + 1.5))
    labels = [f"{r.shape} | {r.backend} {r.config if r.config != '-' else ''}" for r in timed]
    err = [(r.spread_pct or 0) / 100 * r.median_ms / 2 for r in timed]
    ax.barh(
        labels,
        [r.median_ms for r in timed],
        xerr=err,
        color=["#888" if r.baseline else "#36c" for r in timed],
    )
    ax.set_xlabel("median time (ms), bar = IQR")
    ax.invert_yaxis()
    out.append(("Time per config", _png(fig)))
    plt.close(fig)

    others = [r for r in timed if not r.baseline and r.speedup]
    if others:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        backends = list(dict.fromkeys(f"{r.backend} {r.config}" for r in others))
        width = 0.8 / len(backends)
        for i, b in enumerate(backends):
            ys = [
                next((r.speedup for r in others if r.shape == s and f"{r.backend} {r.config}" == b), 0)
                for s in shapes
            ]
            ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=b)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes, rotation=30, ha="right")
        ax.set_ylabel("speedup over baseline")
        ax.legend(fontsize=7)
        out.append(("Speedup per shape", _png(fig)))
        plt.close(fig)

    for title, png in _timeseries_plots(plt, trials_series):
        out.append((title, png))
    for title, png in _scaling_plots(plt, scaling):
        out.append((title, png))

    with_tp = [r for r in timed if r.tflops is not None]
    if with_tp:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        ax.scatter(range(len(with_tp)), [r.tflops for r in with_tp])
        ax.set_xticks(
            range(len(with_tp)), [f"{r.backend}\n{r.shape}" for r in with_tp], fontsize=6, rotation=60
        )
        ax.set_ylabel("TFLOPS")
        lim = limits_for(device_name)
        if lim:
            for dtype, peak in lim.dense_tflops.items():
                ax.axhline(peak, ls="--", lw=0.8, label=f"{lim.name} {dtype} dense peak {peak:g}")
            ax.legend(fontsize=7)
            title = f"Throughput against {lim.name} limits"
        else:
            title = f"Throughput (device limits unknown for {device_name or 'this device'})"
        out.append((title, _png(fig)))
        plt.close(fig)
    return out


def render_html(store: Store, job_id: int) -> str:
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    rows = build_rows(store, job_id)
    envs = store.environments(job_id)
    device = next((e.device_name for e in envs if e.device_kind == "gpu"), None)
    timing = "GPU timings" if device else "CPU timings (not GPU numbers)"
    esc = html.escape
    head = [
        "trial",
        "shape",
        "backend",
        "config",
        "dtype",
        "status",
        "median ms",
        "spread %",
        "stop",
        "speedup",
        "TFLOPS",
        "GB/s",
    ]
    extra = [
        (k, label, fmt) for k, label, fmt in _family_view(job.family)[0] if any(k in r.extra for r in rows)
    ]
    head += [label for _k, label, _fmt in extra] + ["correct", "node"]
    body = []
    for r in rows:
        vals = [
            r.trial,
            r.shape,
            r.backend + (" (baseline)" if r.baseline else ""),
            r.config,
            r.dtype,
            r.status,
            _num(r.median_ms, ".4f"),
            _num(r.spread_pct, ".1f"),
            (r.stop_reason or "-") + (f" ({r.flags})" if r.flags else ""),
            _num(r.speedup, ".2f"),
            _num(r.tflops, ".3f"),
            _num(r.gbps, ".2f"),
            *(_value(r.extra.get(k), fmt) for k, _label, fmt in extra),
            {True: "pass", False: "FAIL", None: "-"}[r.correct],
            r.node or "-",
        ]
        cls = "" if r.status in NOT_FAILED else ' class="bad"'
        body.append(f"<tr{cls}>" + "".join(f"<td>{esc(str(v))}</td>" for v in vals) + "</tr>")
    series = [
        (f"{t.backend} {_fmt_point(t.shape)}", t.metrics["timeseries"])
        for t in store.trials(job_id)
        if t.metrics and isinstance(t.metrics.get("timeseries"), dict)
    ]
    trials = store.trials(job_id)
    scaling = [(x, metric, trials) for x, metric in _family_view(job.family)[1]]
    plots = "".join(
        f"<h2>{esc(t)}</h2><img src='data:image/png;base64,{p}'/>"
        for t, p in _plots(rows, device, series, scaling)
    )
    env_items = "".join(
        f"<li>{esc(e.host)}: {esc(e.device_name)} ({esc(e.device_kind)}), torch "
        f"{esc(str(e.data.get('torch')))}</li>"
        for e in envs
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>KernelFarm job {job.id}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} tr.bad{{background:#fdd}}</style></head><body>
<h1>Job {job.id}: {esc(job.name)} ({esc(job.family)})</h1>
<p>Status {esc(job.status)}; kernels at {esc(job.git_commit or "unknown commit")}; {timing}.</p>
<ul>{env_items}</ul>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{"".join(body)}</table>
{plots}
</body></html>
"""
