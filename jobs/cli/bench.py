"""`farm bench`: one point of one kernel, measured in this process, for a tight edit-run loop.

No Ray, no store, no spec: the family is imported here, the trial runs as a worker would run it (same
TrialRequest, same measurement policy defaults, Triton in the interpreter when no GPU is visible), and the
measurement, the correctness verdict, the rates derived from the family's Cost and, where a Triton kernel
of ours runs, its compiled resources (kernels.compiled) are printed. Exit 0 when the trial passed, 1 when
it did not (incorrect, error, timeout), 2 for bad input.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from jobs.cli.common import console, parse_point
from jobs.errors import BadInput
from kernels.measure.cpu_share import level_label

SPECS_DIR = Path(__file__).resolve().parents[1] / "specs"  # the shipped specs (jobs/specs/)


def _point(text: str | None, what: str) -> dict[str, Any]:
    try:
        return parse_point(text, what) or {}
    except ValueError as e:
        raise BadInput(str(e)) from None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@click.command("bench")
@click.argument("family")
@click.option("--backend", default=None, help="backend name (default: the family's reference)")
@click.option("--shape", "shape_text", required=True, help="K=V,... the whole shape, e.g. m=128,n=128,k=128")
@click.option("--config", "config_text", default=None, help="K=V,... the backend's config")
@click.option("--dtype", default=None, help="default: the first dtype of the family's shipped spec")
@click.option("--max-time", "max_time_s", type=click.FloatRange(min=0.01), default=2.0, show_default=True,
              help="seconds of measuring at most")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the outcome as JSON")
def bench(
    family: str,
    backend: str | None,
    shape_text: str,
    config_text: str | None,
    dtype: str | None,
    max_time_s: float,
    as_json: bool,
) -> None:
    """Measure one point of FAMILY in this process and print what the farm would store."""
    import torch

    if not torch.cuda.is_available():  # as a worker does: before any family imports triton
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from kernels.base import TrialRequest, TrialStatus, derive_rates, trial_label
    from kernels.hardware import device_limits
    from kernels.measure.policy import MeasurePolicy
    from kernels.registry import UnknownFamily, get_family

    try:
        fam = get_family(family)
    except UnknownFamily as e:
        raise BadInput(str(e)) from None
    backend = backend or fam.backends.reference.name
    if backend not in fam.backends:
        raise BadInput(f"--backend: {family} has no backend {backend!r} (known: {', '.join(fam.backends)})")
    shape, config = _point(shape_text, "--shape"), _point(config_text, "--config")
    dtype = dtype or _shipped_dtype(family)
    try:
        fam.validate(shape, config, dtype, backend)
    except ValueError as e:
        raise BadInput(str(e)) from None

    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = MeasurePolicy(max_time_s=max_time_s, min_time_s=min(0.5, max_time_s / 2))
    out = fam.run(TrialRequest(family, backend, shape, config, dtype, policy=policy, device=device))
    compiled = _compiled(fam, shape, config, dtype, backend)
    rates = None
    if out.median_ns:
        rates = derive_rates(fam.cost(shape, dtype), out.median_ns, device_limits(device))

    if as_json:
        doc = {"label": trial_label(backend, shape, config, dtype), **out.to_dict(), "compiled": compiled}
        doc["rates"] = asdict(rates) if rates is not None else None
        click.echo(json.dumps(doc, default=str, indent=2))
    else:
        _print(trial_label(backend, shape, config, dtype), device, out, rates, compiled)
    if out.status not in (TrialStatus.OK, TrialStatus.SKIPPED, TrialStatus.PRUNED):
        raise SystemExit(1)


def _shipped_dtype(family: str) -> str:
    """The first dtype of jobs/specs/FAMILY_cpu.yaml (else FAMILY.yaml); float32 without either."""
    from jobs.spec.sweep import load_spec

    for name in (f"{family}_cpu.yaml", f"{family}.yaml"):
        if (SPECS_DIR / name).is_file():
            return load_spec(SPECS_DIR / name).dtypes[0]
    return "float32"


def _compiled(fam: Any, shape: dict, config: dict, dtype: str, backend: str) -> Any:
    """The compiled check of the trial's Triton launches, or why there is none."""
    try:
        from kernels.compiled import trial_check
    except ImportError as e:  # pragma: no cover - Triton missing
        return {"checked": False, "reason": f"kernels.compiled unavailable: {e}"}
    try:
        return trial_check(fam, shape, config, dtype, backend)
    except Exception as e:  # noqa: BLE001 - evidence is best effort here; the trial's own result stands
        return {"checked": False, "reason": f"{type(e).__name__}: {e}"}


def _print(label: str, device: str, out: Any, rates: Any, compiled: Any) -> None:
    out_console = console()
    error = f" ({escape(out.error)})" if out.error else ""
    out_console.print(f"[bold]{escape(label)}[/bold] on {device}: [bold]{out.status}[/bold]{error}")
    table = Table(show_header=False, box=None, pad_edge=False)
    if out.summary is not None:
        s = out.summary
        table.add_row("median", f"{s.median / 1e6:.4g} ms")
        for name in ("p10", "p90", "mean", "stdev"):
            v = getattr(s, name, None)
            if isinstance(v, (int, float)):
                table.add_row(name, f"{v / 1e6:.4g} ms")
        table.add_row("samples", f"{len(out.samples_ns)} (stop: {out.stop_reason}, timer: {out.timer})")
        if (level := level_label(s.clocks or {})) is not None:
            table.add_row("level", level)
    if rates is not None:
        for name, v in asdict(rates).items():
            if v is not None:
                table.add_row(name, _fmt(v))
    for name, v in out.correctness.items():  # the scalars; per-seed details are in --json
        if v is not None and not isinstance(v, (list, dict)):
            table.add_row(f"correctness.{name}", escape(_fmt(v)))
    if compiled is not None:
        table.add_row("compiled", escape(_fmt(compiled)))
    out_console.print(table)
