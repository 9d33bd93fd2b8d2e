"""A/B of tile configs, and the export of the best ones, over stored sweep jobs.

`farm compare JOB_A [JOB_B]`: for every shape, one trial per side side by side (time, TFLOPS, GB/s,
spread, shared memory, waves, registers and spills when known) and the verdict of
kernels.measure.stats.compare on the two trials' raw samples, A the baseline and B the candidate
("faster" means B is faster). A side is chosen by a selector, `--config-a K=V,...` (`backend=` may be
one of the keys): among a job's trials for the shape that match it (baseline-backend trials only when
named), the fastest correct one. With one job, both selectors are needed: two configs inside one job.

`farm export best-configs JOB`: the fastest correct config per (N, K) and M as JSON keyed the way Triton
ports key their tuned configs, {"N=2112,K=7168": {"64": {"BLOCK_SIZE_M": 64, ..., "num_stages": 3}}};
`--split-dir` writes one file per (N, K) named as those ports name them.

The click objects `compare` and `export` are mounted on the `farm` group by jobs.cli.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from jobs.settings import FarmSettings
from jobs.store import Store, TrialRow
from kernels.base import TrialStatus
from kernels.fp8_gemm.export import best_configs as fp8_best_configs
from kernels.fp8_gemm.export import port_file_name
from kernels.measure.stats import compare as compare_samples

# ---- selecting one trial per shape ------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """`backend=triton,block_m=64`: which trials of a job one side of the A/B may be."""

    backend: str | None = None
    config: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> Selector:
        if not text:
            return cls()
        backend, config = None, []
        for part in text.split(","):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or not key or not raw.strip():
                raise click.BadParameter(f"expected K=V[,K=V...] (got {part!r} in {text!r})")
            value = yaml.safe_load(raw.strip())  # 64 -> int, true -> bool, triton -> str
            if key == "backend":
                backend = str(value)
            else:
                config.append((key, value))
        return cls(backend, tuple(config))

    def matches(self, t: TrialRow) -> bool:
        if self.backend is not None and t.backend != self.backend:
            return False
        if self.backend is None and t.baseline:
            return False
        return all(k in t.config and t.config[k] == v for k, v in self.config)

    def label(self) -> str:
        parts = ([f"backend={self.backend}"] if self.backend else []) + [f"{k}={v}" for k, v in self.config]
        return ",".join(parts) or "(any non-baseline)"


def _shape_key(t: TrialRow) -> str:
    return json.dumps([sorted(t.shape.items()), t.dtype])


def _rank(t: TrialRow) -> tuple[int, float]:
    good = t.status == TrialStatus.OK and t.median_ns is not None
    return (0 if good else 1, t.median_ns if good else 0.0)


def pick(trials: Iterable[TrialRow], selector: Selector) -> tuple[TrialRow | None, int]:
    """The fastest ok trial the selector matches (else the first match, to show its status), and how
    many matched."""
    matched = [t for t in trials if selector.matches(t)]
    if not matched:
        return None, 0
    return min(matched, key=_rank), len(matched)


# ---- one side's figures ------------------------------------------------------------------------------


@dataclass
class Side:
    job_id: int
    trial_id: int
    backend: str
    config: dict[str, Any]
    status: str
    candidates: int
    median_ns: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    spread_cv: float | None = None
    calc_diff: float | None = None
    smem_bytes: int | None = None
    smem_source: str | None = None  # "compiled" | "model"
    waves: int | None = None
    last_wave_util: float | None = None
    regs: int | None = None
    regs_source: str | None = None  # "compiled" | "model estimate"
    spills: int | None = None
    error: str | None = None


def side_of(t: TrialRow, job_id: int, candidates: int) -> Side:
    metrics = t.metrics or {}
    summary = t.summary or {}
    res = t.resources or {}
    model = res.get("model") or {}
    compiled = res.get("compiled") or {}
    side = Side(
        job_id=job_id,
        trial_id=t.id,
        backend=t.backend,
        config=dict(t.config),
        status=t.status,
        candidates=candidates,
        median_ns=t.median_ns,
        tflops=metrics.get("tflops"),
        gbps=metrics.get("gbps"),
        spread_cv=summary.get("cv"),
        calc_diff=metrics.get("calc_diff"),
        error=(t.error or "").strip().splitlines()[-1][:200] if t.error else None,
    )
    if "waves" in model:
        side.waves = model["waves"]["waves"]
        side.last_wave_util = model["waves"]["last_wave_util"]
    if compiled.get("collected"):
        side.smem_bytes, side.smem_source = compiled["shared_bytes"], "compiled"
        side.regs, side.regs_source = compiled["n_regs"], "compiled"
        side.spills = compiled.get("n_spills")
    elif "smem_total" in model:
        side.smem_bytes, side.smem_source = model["smem_total"], "model"
        side.regs, side.regs_source = model["regs_estimate"], "model estimate"
    return side


@dataclass
class ShapeRow:
    shape: dict[str, Any]
    dtype: str
    a: Side | None
    b: Side | None
    comparison: dict[str, Any] | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    job_a: int
    job_b: int
    select_a: str
    select_b: str
    rows: list[ShapeRow] = field(default_factory=list)

    def verdicts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            v = r.comparison["verdict"] if r.comparison else "n/a"
            out[v] = out.get(v, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdicts"] = self.verdicts()
        return d


def compare_jobs(
    store: Store,
    job_a: int,
    job_b: int | None = None,
    select_a: Selector | None = None,
    select_b: Selector | None = None,
    *,
    min_effect: float = 0.05,
    alpha: float = 0.002,
) -> CompareResult:
    """The A/B per shape (shapes of either job, in job A's order first). ValueError for a bad request."""
    select_a, select_b = select_a or Selector(), select_b or Selector()
    if job_b is None:
        if select_a == Selector() or select_b == Selector():
            raise ValueError("comparing two configs inside one job needs both --config-a and --config-b")
        if select_a == select_b:
            raise ValueError("--config-a and --config-b select the same trials")
    jb = job_a if job_b is None else job_b
    for j in {job_a, jb}:
        if store.get_job(j) is None:
            raise ValueError(f"no job {j} in {store.url}")
    trials_a, trials_b = store.trials(job_a), store.trials(jb)
    order: dict[str, TrialRow] = {}
    for t in trials_a + trials_b:
        order.setdefault(_shape_key(t), t)
    result = CompareResult(job_a, jb, select_a.label(), select_b.label())
    for key, example in order.items():
        ta, na = pick((t for t in trials_a if _shape_key(t) == key), select_a)
        tb, nb = pick((t for t in trials_b if _shape_key(t) == key), select_b)
        row = ShapeRow(
            shape=dict(example.shape),
            dtype=example.dtype,
            a=side_of(ta, job_a, na) if ta else None,
            b=side_of(tb, jb, nb) if tb else None,
        )
        result.rows.append(_judge(store, row, ta, tb, min_effect, alpha))
    return result


def _judge(
    store: Store, row: ShapeRow, ta: TrialRow | None, tb: TrialRow | None, min_effect: float, alpha: float
) -> ShapeRow:
    if ta is None or tb is None:
        row.note = f"no trial matches {'A' if ta is None else 'B'} for this shape"
        return row
    if ta.id == tb.id:
        row.note = "A and B are the same trial"
        return row
    bad = [f"{s} is {t.status}" for s, t in (("A", ta), ("B", tb)) if t.status != TrialStatus.OK]
    if bad and any(t.status != TrialStatus.INCORRECT for t in (ta, tb) if t.status != TrialStatus.OK):
        row.note = "; ".join(bad) + ": no timing to compare"
        return row
    cmp = compare_samples(
        store.kept_samples(ta.id), store.kept_samples(tb.id), min_effect=min_effect, alpha=alpha
    )
    row.comparison = cmp.to_dict()
    if bad:
        row.note = "; ".join(bad) + " (timed, but its output failed the correctness check)"
    return row


# ---- best configs ------------------------------------------------------------------------------------


def best_configs(store: Store, job_id: int, backend: str = "triton") -> tuple[dict[str, Any], list[str]]:
    """The job's best FP8 GEMM tile configs (kernels.fp8_gemm.export), and the shapes without one."""
    if store.get_job(job_id) is None:
        raise ValueError(f"no job {job_id} in {store.url}")
    return fp8_best_configs(store.trials(job_id), backend)


# ---- click -------------------------------------------------------------------------------------------


def _store(db: str | None) -> Store:
    return Store(db or FarmSettings().db)


db_option = click.option(
    "--db", default=None, help="SQLAlchemy URL or SQLite path (env FARM_DB; default .farm/farm.db)"
)


def _fmt(v: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, fmt)


def _side_cells(s: Side | None) -> list[str]:
    if s is None:
        return ["-"] * 9
    cfg = " ".join(f"{k}={v}" for k, v in s.config.items()) or "-"
    regs = "-" if s.regs is None else (f"~{s.regs}" if s.regs_source != "compiled" else str(s.regs))
    if s.spills is not None:
        regs += f"/{s.spills}"
    waves = "-" if s.waves is None else f"{s.waves} ({s.last_wave_util:.0%})"
    smem = (
        "-"
        if s.smem_bytes is None
        else f"{s.smem_bytes / 1024:.1f}" + ("" if s.smem_source == "compiled" else "*")
    )
    status = s.status + (f" (best of {s.candidates})" if s.candidates > 1 else "")
    return [
        f"{s.backend} {cfg}",
        status,
        _fmt(s.median_ns, ".2f", 1e-3),
        _fmt(s.tflops, ".3f"),
        _fmt(s.gbps, ".1f"),
        _fmt(s.spread_cv, ".1%"),
        smem,
        waves,
        regs,
    ]


def render(result: CompareResult, console: Console) -> None:
    console.print(
        f"A: job {result.job_a} [{result.select_a}]   B: job {result.job_b} [{result.select_b}]   "
        "(verdict is B relative to A)"
    )
    table = Table(show_lines=True)
    for col in ("shape", "", "backend / config", "status", "median us", "TFLOPS", "GB/s", "spread",
                "smem KB", "waves (last)", "regs/spills", "verdict"):  # fmt: skip
        table.add_column(col)
    for r in result.rows:
        shape = " ".join(f"{k}={v}" for k, v in r.shape.items())
        c = r.comparison
        verdict = r.note
        if c is not None:
            ratio = "-" if c["ratio"] is None else f"x{c['ratio']:.3f}"
            verdict = f"{c['verdict']} {ratio} ({c['reason']})" + (f"; {r.note}" if r.note else "")
        table.add_row(shape, "A", *_side_cells(r.a), "")
        table.add_row("", "B", *_side_cells(r.b), verdict)
    console.print(table)
    console.print("smem: * = static model (no compiled kernel); regs: ~ = model estimate")
    console.print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(result.verdicts().items())))


@click.command("compare")
@click.argument("job_a", type=int)
@click.argument("job_b", type=int, required=False)
@db_option
@click.option("--config-a", default=None, help="select side A: K=V,... over config keys (and backend=)")
@click.option("--config-b", default=None, help="select side B, same form")
@click.option("--min-effect", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.002)
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON")
@click.option("--fail-on-slower", is_flag=True, help="exit 1 when B is slower than A on any shape")
def compare(
    job_a: int,
    job_b: int | None,
    db: str | None,
    config_a: str | None,
    config_b: str | None,
    min_effect: float,
    alpha: float,
    as_json: bool,
    fail_on_slower: bool,
) -> None:
    """A/B per shape: two tile configs from two jobs, or two configs inside one job."""
    store = _store(db)
    try:
        result = compare_jobs(
            store,
            job_a,
            job_b,
            Selector.parse(config_a),
            Selector.parse(config_b),
            min_effect=min_effect,
            alpha=alpha,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        render(result, Console(width=200))
    if fail_on_slower and result.verdicts().get("slower"):
        sys.exit(1)


@click.group("export")
def export() -> None:
    """Export results for other tools."""


@export.command("best-configs")
@click.argument("job", type=int)
@db_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--backend", default="triton", show_default=True)
@click.option(
    "--split-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="also write one file per (N, K), named as the Triton ports look them up",
)
def export_best_configs(
    job: int, db: str | None, output: Path | None, backend: str, split_dir: Path | None
) -> None:
    """The fastest correct config per (N, K) and M, as Triton ports key their tuned configs."""
    store = _store(db)
    try:
        table, missing = best_configs(store, job, backend)
        envs = store.environments(job)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    finally:
        store.close()
    for m in missing:
        click.echo(f"no correct {backend} config for {m}", err=True)
    text = json.dumps(table, indent=2)
    if output is None:
        click.echo(text)
    else:
        output.write_text(text + "\n")
        click.echo(f"wrote {len(table)} (N, K) entries to {output}", err=True)
    if split_dir is not None:
        split_dir.mkdir(parents=True, exist_ok=True)
        device = envs[0].device_name if envs else "unknown"
        for nk, by_m in table.items():
            (split_dir / port_file_name(nk, device)).write_text(json.dumps(by_m, indent=2) + "\n")
        click.echo(f"wrote {len(table)} files to {split_dir}", err=True)
