"""Run-level regression statistics: a verdict that holds across runs, not only within one.

The samples of one run are not independent draws of the point's time: a run shares its clocks,
temperature, neighbours and memory placement, and those drift between runs. A Mann-Whitney test on the
samples of one baseline run and one candidate run (kernels.measure.stats.compare_samples) measures how
sure we are that THESE two runs differ; with thousands of samples it calls a 6% difference between two
runs of unchanged code "significant" at p=1e-8. So the verdict is taken on run-level numbers:

- each run is reduced to its median; the ratio is exp(mean log median(candidate runs) - mean log
  median(baseline runs)), or, for interleaved rounds (A then B on one worker), exp(mean of the per-round
  log ratios): pairing removes the drift the two sides share;
- the run-to-run spread (standard deviation of a run's log median) is measured from the runs when a
  side has two or more, and never taken below a prior: `DRIFT_GPU` (2%) on a GPU, `DRIFT_CPU` (10%) on
  a shared CPU, 25% when a run was flagged contended (starved of CPU). With one run per side the prior
  is all there is;
- the interval is the ratio times exp(+-z * standard error), z for `CONFIDENCE`, widened on one side by
  what load may have added to a run that showed it (`inflated`): a neighbour only ever adds time, and a
  run whose samples drifted (the `drift` flag) has its median between its quiet and its loaded level, at
  most its drift above the quiet one. So a drifting candidate lowers the interval's low end by its drift
  (it may be less slow than it reads), a drifting baseline raises the high end by its own.

Verdict ("slower" shown; "faster" is its mirror):
  slower     the within-run comparison says slower, the run-level ratio is at least 1 + min_effect (the
             effect-size threshold), and the run-level interval lies above 1: drift alone does not
             explain it;
  same       no run is noisy (robust cv above max_cv) and the run-level ratio is within 1 +- min_effect;
  ambiguous  everything else, e.g. a shift above the threshold that run-to-run drift could explain:
             a suspect for `farm accept --confirm` (interleaved A/B rounds), never a failure by itself
             on CPU timings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.measure.stats import VERDICTS, Comparison, compare_samples, finite_or_none

DRIFT_GPU = 0.02  # sd of one run's log median between runs on a dedicated GPU (clocks, temperature)
DRIFT_CPU = 0.10  # the same on a shared CPU (load, frequency scaling, cache neighbours)
CONFIDENCE = 0.99
_Z = {0.95: 1.959964, 0.99: 2.575829}


CONTAMINATED_DRIFT = 0.25  # a run flagged contended: its median may be the machine's load


def prior_drift(on_cpu: bool, contended: bool = False) -> float:
    """The run-to-run sd of a log median assumed when one run each is all there is; a run whose process
    was starved of CPU (the `contended` flag) tells less, by CONTAMINATED_DRIFT. (A run that drifted is
    not given a larger sd: what load added to it is a one-sided allowance, see `compare_runs`.)"""
    base = DRIFT_CPU if on_cpu else DRIFT_GPU
    return max(base, CONTAMINATED_DRIFT) if contended else base


def robust_cv(samples: Sequence[float]) -> float:
    """1.4826 * MAD / median: the cv of normal noise, robust to one preempted sample."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < 2:
        return math.inf
    med = float(np.median(x))
    return math.inf if med <= 0 else float(1.4826 * np.median(np.abs(x - med)) / med)


@dataclass(frozen=True)
class RunComparison:
    verdict: str
    reason: str
    within: Comparison  # the pooled-sample comparison (its p-value is about these runs only)
    # None when no ratio can be computed (a run of fewer than 3 samples, a zero median): ``reason`` says why
    run_ratio: float | None
    run_low: float | None
    run_high: float | None
    runs_baseline: int
    runs_candidate: int
    paired: bool
    spread: float  # the run-to-run sd of a log median used
    spread_source: str  # "measured" or "prior"
    # what load may have added to each side's log median (baseline, candidate): their drift, 0 if none
    inflated: tuple[float, float] = (0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The within-run figures under their usual names (ratio, ci_low, p_value, ...), then the
        run-level ones; the verdict and its reason are the run-level ones."""
        return {
            **self.within.to_dict(),
            "within_verdict": self.within.verdict,
            "within_reason": self.within.reason,
            "verdict": self.verdict,
            "reason": self.reason,
            "run_ratio": self.run_ratio,
            "run_ci_low": self.run_low,
            "run_ci_high": self.run_high,
            "runs_baseline": self.runs_baseline,
            "runs_candidate": self.runs_candidate,
            "paired_rounds": self.paired,
            "run_spread": self.spread,
            "run_spread_source": self.spread_source,
            "run_load_allowance": list(self.inflated),
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> RunComparison:
        """A comparison as `to_dict` stored it (an anomaly's evidence holds it among other fields) read
        back typed: a missing or non-finite figure is None. Evidence from before the run-level verdict has
        no run figures: its run ratio is the within-run ratio, as its verdict was."""
        d = data if isinstance(data, Mapping) else {}
        within = Comparison.from_stored(d)
        run_level = "run_ratio" in d
        verdict = d.get("verdict")

        def count(key: str) -> int:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 1

        return cls(
            verdict=verdict if verdict in VERDICTS else "ambiguous",
            reason=str(d.get("reason") or ""),
            within=within,
            run_ratio=finite_or_none(d.get("run_ratio")) if run_level else within.ratio,
            run_low=finite_or_none(d.get("run_ci_low")) if run_level else within.ci_low,
            run_high=finite_or_none(d.get("run_ci_high")) if run_level else within.ci_high,
            runs_baseline=count("runs_baseline"),
            runs_candidate=count("runs_candidate"),
            paired=d.get("paired_rounds") is True,
            spread=finite_or_none(d.get("run_spread")) or 0.0,
            spread_source=str(d.get("run_spread_source") or "prior"),
            inflated=_allowance(d.get("run_load_allowance")),
        )


def _allowance(stored: Any) -> tuple[float, float]:
    if isinstance(stored, list | tuple) and len(stored) == 2:
        b, c = (finite_or_none(v) for v in stored)
        return (b or 0.0, c or 0.0)
    return (0.0, 0.0)


def _log_medians(runs: Sequence[Sequence[float]]) -> np.ndarray:
    return np.log(np.asarray([float(np.median(r)) for r in runs], dtype=np.float64))


def compare_runs(
    baseline_runs: Sequence[Sequence[float]],
    candidate_runs: Sequence[Sequence[float]],
    *,
    min_effect: float,
    alpha: float,
    max_cv: float,
    prior: float,
    paired: bool = False,
    confidence: float = CONFIDENCE,
    inflated: tuple[float, float] = (0.0, 0.0),
) -> RunComparison:
    """Compare runs of raw samples (ns; lower is better). `paired`: baseline_runs[i] and
    candidate_runs[i] were measured as round i, back to back on one worker. `inflated`: how much (|log|)
    load may have added to the baseline's and the candidate's medians (the module docstring)."""
    if min(inflated) < 0 or not all(math.isfinite(v) for v in inflated):
        raise ValueError(f"inflated must be two finite allowances >= 0, not {inflated}")
    if not baseline_runs or not candidate_runs:
        raise ValueError("compare_runs needs at least one run on each side")
    if paired and len(baseline_runs) != len(candidate_runs):
        raise ValueError("paired rounds need as many baseline runs as candidate runs")
    pooled_b = [v for r in baseline_runs for v in r]
    pooled_c = [v for r in candidate_runs for v in r]
    within = compare_samples(pooled_b, pooled_c, min_effect=min_effect, alpha=alpha, max_cv=max_cv)
    nb, nc = len(baseline_runs), len(candidate_runs)
    if any(len(r) < 3 for r in (*baseline_runs, *candidate_runs)) or within.ratio is None:
        return RunComparison(
            "ambiguous", f"a run has too few samples ({within.reason})", within, None, None, None, nb, nc,
            paired, prior, "prior", inflated,
        )  # fmt: skip
    lb, lc = _log_medians(baseline_runs), _log_medians(candidate_runs)
    if paired:
        diffs = lc - lb
        shift = float(diffs.mean())
        measured = float(diffs.std(ddof=1) / math.sqrt(2)) if nb >= 2 else None  # per-run sd
        n_eff = 2.0 / nb  # var(mean of diffs) = 2 sd^2 / rounds
    else:
        shift = float(lc.mean() - lb.mean())
        dev = [lb - lb.mean()] if nb >= 2 else []
        dev += [lc - lc.mean()] if nc >= 2 else []
        df = sum(d.size - 1 for d in dev)
        measured = math.sqrt(sum(float((d**2).sum()) for d in dev) / df) if df else None
        n_eff = 1.0 / nb + 1.0 / nc
    spread = prior if measured is None else max(measured, prior)
    source = "measured" if measured is not None and measured > prior else "prior"
    half = _Z.get(confidence, 2.575829) * spread * math.sqrt(n_eff)
    ratio = math.exp(shift)
    low, high = math.exp(shift - half - inflated[1]), math.exp(shift + half + inflated[0])
    noise = max(robust_cv(r) for r in (*baseline_runs, *candidate_runs))
    verdict, reason = _decide(
        within, ratio, low, high, noise, min_effect, max_cv, spread, nb, nc, paired, inflated
    )
    return RunComparison(verdict, reason, within, ratio, low, high, nb, nc, paired, spread, source, inflated)


def _decide(
    within: Comparison,
    ratio: float,
    low: float,
    high: float,
    noise: float,
    min_effect: float,
    max_cv: float,
    spread: float,
    nb: int,
    nc: int,
    paired: bool,
    inflated: tuple[float, float],
) -> tuple[str, str]:
    runs = f"{nc} round(s) interleaved" if paired else f"{nb} baseline vs {nc} candidate run(s)"
    interval = f"run-level interval [{low:.3f}, {high:.3f}] over {runs}, run-to-run drift {spread:.1%}"
    if any(inflated):
        interval += f", load drift allowed {math.expm1(inflated[0]):.0%} / {math.expm1(inflated[1]):.0%}"
    effect = abs(ratio - 1.0)
    direction = "slower" if ratio > 1.0 else "faster"
    clear = low > 1.0 if direction == "slower" else high < 1.0
    if within.verdict == direction and effect >= min_effect and clear:
        return direction, f"{effect:.1%} change >= {min_effect:.1%}; {interval}"
    if within.verdict in ("slower", "faster") and effect >= min_effect:
        return "ambiguous", (
            f"{effect:.1%} {direction} within these runs (p={within.p_value or 0:.2g}), but run-to-run drift "
            f"could explain it: {interval} includes 1"
        )
    if noise <= max_cv and effect < min_effect:
        return "same", f"run-level change {ratio - 1.0:+.1%} within +-{min_effect:.1%}; {interval}"
    if noise > max_cv:
        return "ambiguous", f"dispersion too high (cv {noise:.1%} > {max_cv:.1%}): no pass on noisy data"
    return "ambiguous", f"{within.reason}; {interval}"
