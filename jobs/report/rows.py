"""The view of a job's trials that every report shares: one `Row` per trial (`build_rows`), the family's
declared report metrics and scaling (`family_view`), a speedup with its bootstrap interval
(`speedup_ci`), what a job's reports read of the store, each once (`JobReads`: the table and the page of
`farm report JOB --html` share one), and the few formatting rules the terminal, the exports and the HTML
pages all follow.

The terminal report (jobs.report.render) and the HTML pages (jobs.report.html and the modules it
assembles) both read this module; neither imports the other's internals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from jobs.store import Environment, Job, Store, TrialRow
from kernels.base import TrialStatus
from kernels.registry import get_family

N_BOOT = 400  # a speedup's bootstrap resamples
CONFIDENCE = 0.95  # ... and its interval


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
    level: str | None = None  # a CPU timing's level (kernels.measure.cpu_share: wall, or less run-queue wait)
    core_share: float | None = None  # the share of a core the timed calls got, where known


@dataclass
class Speedup:
    """A trial against its baseline: baseline median / median, with a 95% bootstrap interval."""

    shape: str
    label: str
    speedup: float
    low: float
    high: float


def family_view(family: str) -> tuple[tuple, tuple]:
    """(report_metrics, scaling) the family declares; none when it declares none or cannot be imported."""
    try:
        fam = get_family(family)
    except Exception:  # noqa: BLE001 - a report must render even for a family no longer installed
        return (), ()
    return tuple(fam.report_metrics), tuple(fam.scaling)


def point_text(point: dict[str, Any]) -> str:
    """A shape or a config as `k=v k=v` (empty for none)."""
    return " ".join(f"{k}={v}" for k, v in point.items())


def fmt_point(point: dict[str, Any]) -> str:
    """A shape or a config as `k=v k=v`, `-` for none: the rows' shape and config columns."""
    return point_text(point) or "-"


def label(r: Row) -> str:
    """A row's backend with its config: the name of its series on a figure."""
    return r.backend + ("" if r.config == "-" else f" {r.config}")


def num(v: float | None, fmt: str, scale: float = 1.0) -> str:
    """`v * scale` formatted, `-` for none (or a value that is not finite)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v * scale if scale != 1.0 else v, fmt)


def sig(v: float | None, digits: int = 3) -> str:
    """Significant digits, never a bare `0.000` for a small rate (CPU TFLOPS): 0.00123, 45.6, 1234."""
    if v is None:
        return "-"
    if v == 0 or abs(v) >= 10 ** (digits - 1):
        return f"{v:.0f}"
    return f"{v:#.{digits}g}".rstrip(".")


def _baselines(trials: list[Any]) -> dict[tuple[str, str], dict[str, float]]:
    """The timed baseline trials' medians by (shape, dtype) and config."""
    base: dict[tuple[str, str], dict[str, float]] = {}
    for t in trials:
        if t.baseline and t.status == TrialStatus.OK and t.median_ns:
            base.setdefault((fmt_point(t.shape), t.dtype), {})[fmt_point(t.config)] = t.median_ns
    return base


def baseline_for(candidates: dict[str, Any], config: str) -> Any:
    """The baseline to set a trial against: the one on the same config, another config only when the
    baseline has just one; None when there is none."""
    if config in candidates:
        return candidates[config]
    return next(iter(candidates.values())) if len(candidates) == 1 else None


def _row(t: Any, base: dict[tuple[str, str], dict[str, float]], extra_keys: list[str]) -> Row:
    s = t.stats
    m = t.metrics or {}
    c = t.correctness or {}
    median = t.median_ns
    ref = baseline_for(base.get((fmt_point(t.shape), t.dtype), {}), fmt_point(t.config))
    return Row(
        trial=t.seq,
        shape=fmt_point(t.shape),
        backend=t.backend,
        baseline=t.baseline,
        config=fmt_point(t.config),
        dtype=m.get("compute_dtype") or t.dtype,  # what ran (a bf16 backend on fp32 inputs)
        status=t.status,
        attempt=t.attempt,
        median_ms=median / 1e6 if median else None,
        spread_pct=100 * s.iqr / median if median and s.iqr is not None else None,
        cv_pct=100 * s.cv if s.cv is not None else None,
        n=s.n if t.summary is not None else None,
        stop_reason=t.stop_reason,
        flags=",".join(s.flags),
        speedup=ref / median if ref and median else None,
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
        level=(s.clocks or {}).get("level"),
        core_share=(s.clocks or {}).get("core_share"),
    )


def build_rows(store: Store, job_id: int, trials: list[Any] | None = None) -> list[Row]:
    """One row per trial of the job, in its order; the speedup over the baseline backend on the same shape
    and dtype (same config when the baseline has it). `trials`: the job's, when read already."""
    trials = store.trials(job_id) if trials is None else trials
    extra_keys = [key for key, _label, _fmt in family_view(trials[0].family)[0]] if trials else []
    base = _baselines(trials)
    return [_row(t, base, extra_keys) for t in trials]


@dataclass
class JobReads:
    """What a job's reports read of the store, each once and when first used: the job, its trials (by
    seq), their rows (build_rows), the environments they ran in, its anomalies and failures (the verdict's,
    the stored baseline's and the anomalies' table), and the kept samples of the trials the
    speedups and figures use (the job's timed trials in one read, a baseline job's matched trials in one
    more). `farm report JOB --html` prints the table and writes the page from one JobReads."""

    store: Store
    job_id: int
    samples: dict[int, list[int]] = field(default_factory=dict)
    recent: Any = None  # a jobs.report.recent.RecentReads several pages share (a site's night), or None

    @cached_property
    def job(self) -> Job | None:
        return self.store.get_job(self.job_id)

    @cached_property
    def trials(self) -> list[TrialRow]:
        return self.store.trials(self.job_id)

    @cached_property
    def rows(self) -> list[Row]:
        return build_rows(self.store, self.job_id, self.trials)

    @cached_property
    def environments(self) -> list[Environment]:
        return self.store.environments(self.job_id)

    @cached_property
    def anomalies(self) -> list[Any]:
        return self.store.anomalies(self.job_id)

    @cached_property
    def failures(self) -> list[Any]:
        """The failure bank's entries of the job."""
        return self.store.failures(job_id=self.job_id)

    def ids(self) -> dict[int, int]:
        """A trial's seq (a row's `trial`) -> its id."""
        return {t.seq: t.id for t in self.trials}

    def kept(self, trial_ids: Iterable[int]) -> dict[int, list[int]]:
        """The kept samples of these trials (and of those read before), read once each."""
        missing = set(trial_ids) - set(self.samples)
        if missing:
            self.samples.update(self.store.kept_samples_of(missing))
        return self.samples

    def timed(self) -> dict[int, list[int]]:
        """The kept samples of the job's timed trials (and of those read before)."""
        return self.kept(t.id for t in self.trials if t.status == TrialStatus.OK and t.median_ns)


def speedup_ci(
    store: Store, base_trial_id: int, trial_id: int, samples: dict[int, list[int]] | None = None
) -> tuple[float, float, float] | None:
    """(baseline median / median, low, high): a speedup with a 95% bootstrap interval over both trials'
    kept samples; None when either has none. `samples` (trial id -> kept samples, Store.kept_samples_of)
    are used when given: a page of many speedups reads them all at once."""
    return speedup_cis(store, [(base_trial_id, trial_id)], samples)[0]


def speedup_cis(
    store: Store, pairs: list[tuple[int, int]], samples: dict[int, list[int]] | None = None
) -> list[tuple[float, float, float] | None]:
    """speedup_ci of each (baseline trial id, trial id), all at once: each trial's samples sorted once, the
    intervals of the pairs whose sides have the same sizes taken together (kernels.measure.stats.
    bootstrap_ratio_cis: bootstrap_ratio_ci's values, in one numpy call a size pair)."""
    import numpy as np

    from kernels.measure.stats import bootstrap_ratio_cis

    ordered: dict[int, np.ndarray] = {}

    def side(trial: int) -> np.ndarray:
        found = ordered.get(trial)
        if found is None:
            values = samples[trial] if samples is not None and trial in samples else store.kept_samples(trial)
            found = ordered[trial] = np.sort(np.asarray(values, dtype=float))
        return found

    out: list[tuple[float, float, float] | None] = [None] * len(pairs)
    sized: dict[tuple[int, int], list[int]] = {}  # (candidate's size, baseline's) -> the pairs
    for i, (a, b) in enumerate(pairs):
        base, cand = side(a), side(b)
        if len(base) and len(cand):
            sized.setdefault((cand.size, base.size), []).append(i)
    for at in sized.values():
        base = np.stack([ordered[pairs[i][0]] for i in at])
        cand = np.stack([ordered[pairs[i][1]] for i in at])
        lows, highs = bootstrap_ratio_cis(  # of the candidate's time over the baseline's: inverted below
            base, cand, n_boot=N_BOOT, confidence=CONFIDENCE, seed=0
        )
        medians = np.median(base, axis=1) / np.median(cand, axis=1)
        for i, ratio, lo, hi in zip(at, medians.tolist(), lows.tolist(), highs.tolist(), strict=True):
            out[i] = (ratio, (1 / hi if hi else float("nan")), (1 / lo if lo else float("nan")))
    return out
