"""A/B of two sweep jobs (or two configs inside one job), shape by shape: `farm compare`.

For every shape, one trial per side side by side (time, TFLOPS, GB/s, spread, shared memory, waves,
registers and spills when known) and the verdict of kernels.measure.stats.compare_samples on the two
trials' raw samples, A the baseline and B the candidate ("faster" means B is faster). A side is chosen
by a selector, `--config-a K=V,...` (`backend=` may be one of the keys): among a job's trials for the
shape that match it (baseline-backend trials only when named), the fastest correct one. With one job,
both selectors are needed: two configs inside one job. The command itself is in jobs/cli/compare.py.

What differs between the environments A and B ran in (jobs.judge.environment) is printed for the two jobs
and kept per shape; a shape whose B is slower across a change that changes performance (torch, driver,
GPU, ...) is ambiguous, naming it: the slowdown may not be the code's (`--fail-on-slower` does not count it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import click
import yaml
from rich.console import Console
from rich.markup import escape

from jobs.judge import environment
from jobs.report.rows import fmt_point, num, point_text
from jobs.report.text_table import TextTable
from jobs.store import Environment, Store, TrialRow
from kernels.base import TrialStatus
from kernels.measure.stats import Comparison, compare_samples

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


def _by_shape(trials: list[TrialRow]) -> dict[str, list[TrialRow]]:
    """The trials by shape and dtype (_shape_key), each in its job's order."""
    out: dict[str, list[TrialRow]] = {}
    for t in trials:
        out.setdefault(_shape_key(t), []).append(t)
    return out


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
        spread_cv=t.stats.cv,
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
    comparison: Comparison | None = None
    note: str = ""
    environment: list[list[str]] = field(default_factory=list)  # what differs from A's to B's (to_list)
    ambiguous: str = ""  # why a slower B is not called slower: the environment changed

    @property
    def verdict(self) -> str:
        if self.comparison is None:
            return "n/a"
        return "ambiguous" if self.ambiguous else self.comparison.verdict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    job_a: int
    job_b: int
    select_a: str
    select_b: str
    rows: list[ShapeRow] = field(default_factory=list)
    environment: list[list[str]] = field(default_factory=list)  # from job A's environments to job B's

    def verdicts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.verdict] = out.get(r.verdict, 0) + 1
        return out

    def environment_lines(self) -> list[str]:
        """What `farm compare` prints of the two jobs' environments (nothing when they are the same)."""
        return environment.summary_lines(environment.stored(self.environment))

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
    env_a, env_b = store.environments(job_a), store.environments(jb)
    envs = {e.id: e for e in env_a + env_b}
    order: dict[str, TrialRow] = {}
    for t in trials_a + trials_b:
        order.setdefault(_shape_key(t), t)
    by_shape_a, by_shape_b = _by_shape(trials_a), _by_shape(trials_b)  # once: linear in the trials
    result = CompareResult(job_a, jb, select_a.label(), select_b.label())
    result.environment = [d.to_list() for d in environment.changes(env_a, env_b)]
    picked = [
        (example, *pick(by_shape_a.get(key, []), select_a), *pick(by_shape_b.get(key, []), select_b))
        for key, example in order.items()
    ]
    samples = store.kept_samples_of(t.id for _e, ta, _na, tb, _nb in picked for t in (ta, tb) if t)
    for example, ta, na, tb, nb in picked:
        row = ShapeRow(
            shape=dict(example.shape),
            dtype=example.dtype,
            a=side_of(ta, job_a, na) if ta else None,
            b=side_of(tb, jb, nb) if tb else None,
        )
        result.rows.append(_across(_judge(samples, row, ta, tb, min_effect, alpha), ta, tb, envs))
    return result


def keep(store: Store, result: CompareResult, *, min_effect: float, alpha: float, one_job: bool) -> int:
    """Store one comparison (jobs.store's `comparisons`): its jobs, selectors, thresholds, verdict counts
    and what differed between the environments; its id."""
    return store.record_comparison(
        job_a=result.job_a,
        job_b=None if one_job else result.job_b,
        selector_a=result.select_a or None,
        selector_b=result.select_b or None,
        min_effect=min_effect,
        alpha=alpha,
        verdicts=result.verdicts(),
        environment=result.environment,
        ambiguous=result.verdicts().get("ambiguous", 0),
    )


def _across(
    row: ShapeRow, ta: TrialRow | None, tb: TrialRow | None, envs: dict[int, Environment]
) -> ShapeRow:
    """The row with what differs between A's and B's environments; a slower B across a change of a
    component that changes performance is ambiguous."""
    if ta is None or tb is None or row.comparison is None:
        return row
    diffs = environment.changes(envs.get(ta.environment_id or -1), envs.get(tb.environment_id or -1))
    row.environment = [d.to_list() for d in diffs]
    if row.comparison.verdict == "slower" and environment.performance(diffs):
        row.ambiguous = environment.ambiguous_reason(diffs)
    return row


def _judge(
    samples: dict[int, list[int]],
    row: ShapeRow,
    ta: TrialRow | None,
    tb: TrialRow | None,
    min_effect: float,
    alpha: float,
) -> ShapeRow:
    """The row with its comparison of A's and B's kept samples (`samples`: trial id -> kept samples)."""
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
    cmp = compare_samples(samples[ta.id], samples[tb.id], min_effect=min_effect, alpha=alpha)
    row.comparison = cmp
    if bad:
        row.note = "; ".join(bad) + " (timed, but its output failed the correctness check)"
    return row


# ---- the terminal table ------------------------------------------------------------------------


def _side_cells(s: Side | None) -> list[str]:
    if s is None:
        return ["-"] * 9
    cfg = fmt_point(s.config)
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
        num(s.median_ns, ".2f", 1e-3),
        num(s.tflops, ".3f"),
        num(s.gbps, ".1f"),
        num(s.spread_cv, ".1%"),
        smem,
        waves,
        regs,
    ]


def render(result: CompareResult, console: Console) -> None:
    console.print(
        f"A: job {result.job_a} [{result.select_a}]   B: job {result.job_b} [{result.select_b}]   "
        "(verdict is B relative to A)"
    )
    for line in result.environment_lines():
        console.print(escape(line))
    cols = ["shape", "", "backend / config", "status", "median us", "TFLOPS", "GB/s", "spread", "smem KB",
            "waves (last)", "regs/spills", "verdict"]  # fmt: skip
    table = TextTable(cols, show_lines=True)  # rich's Table took 5 s for 250 shapes
    for r in result.rows:
        shape = point_text(r.shape)
        c = r.comparison
        verdict = r.note
        if c is not None:
            ratio = "ratio undefined" if c.ratio is None else f"x{c.ratio:.3f}"
            verdict = f"{c.verdict} {ratio} ({c.reason})" + (f"; {r.note}" if r.note else "")
            if r.ambiguous:
                verdict = f"ambiguous: {r.ambiguous}; {verdict}"
        table.add_row(shape, "A", *_side_cells(r.a), "")
        table.add_row("", "B", *_side_cells(r.b), verdict)
    console.print(table)
    console.print("smem: * = static model (no compiled kernel); regs: ~ = model estimate")
    console.print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(result.verdicts().items())))
