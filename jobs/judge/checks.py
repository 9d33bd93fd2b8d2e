"""The card's checks, each evaluated on one trial: an outcome (pass, fail, ambiguous, skip), the reason,
the numbers behind it, and the anomaly it amounts to (if any). See jobs.spec.cards for what each check means.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.judge.runs import RunComparison, compare_runs, prior_drift
from jobs.spec.cards import Card, CardCheck
from jobs.store import Environment, TrialRow
from kernels.base import TrialStatus
from kernels.hardware import limits_for
from kernels.measure.stats import drift_of

PASS, FAIL, AMBIGUOUS, SKIP = "pass", "fail", "ambiguous", "skip"
DEFAULT_MAX_CV = 0.02  # the noise limit of a comparison when the card has no stability section
TUKEY_FAR = 3.0  # samples above Q3 + 3 IQR are far outliers
MAX_TRIMMED = 0.2  # more far outliers than this fraction: the measurement is not stable


def trim(samples: list[int]) -> tuple[list[int], int]:
    """The samples without far outliers above Q3 + 3 IQR, and how many were dropped."""
    if len(samples) < 8:
        return list(samples), 0
    x = np.asarray(samples, dtype=np.float64)
    q1, q3 = np.percentile(x, [25, 75])
    fence = q3 + TUKEY_FAR * (q3 - q1)
    kept = [s for s in samples if s <= fence]
    return kept, len(samples) - len(kept)


@dataclass
class Context:
    """What the checks of one trial see."""

    card: Card
    trial: TrialRow
    env: Environment | None
    baseline: TrialRow | None  # the matching baseline trial, if any
    samples: Callable[[int], list[int]]  # trial id -> raw samples (ns)
    baseline_env: Environment | None = None  # the environment the baseline trial ran in

    @property
    def on_cpu(self) -> bool:
        return self.env is None or self.env.device_kind != "gpu"

    def timings(self, trial_id: int) -> tuple[list[int], int]:
        """The raw samples the verdict uses (far outliers dropped when the card trims) and the count
        dropped."""
        raw = self.samples(trial_id)
        return trim(raw) if self.card.trims(self.on_cpu) else (raw, 0)


@dataclass
class Outcome:
    outcome: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    anomaly: str | None = None  # the anomaly kind this result records


def _number(value: Any) -> float | None:
    """A stored number (JSON keeps NaN/inf as strings); None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def completes(c: Context) -> Outcome:
    t = c.trial
    if TrialStatus(t.status).not_run:  # finished without running, by design: not a failure
        return Outcome(SKIP, f"{t.status}: {(t.error or '').strip()[:200]}", {"status": t.status})
    if TrialStatus(t.status).measured:
        return Outcome(PASS, f"finished ({t.status}), attempt {t.attempt}", {"attempt": t.attempt})
    last = (t.error or "").strip().splitlines()[-1:] or [""]
    failures = (TrialStatus.TIMEOUT, TrialStatus.CRASHED, TrialStatus.ERROR, TrialStatus.INVALID)
    kind = t.status if t.status in failures else "error"
    return Outcome(FAIL, f"{t.status}: {last[0][:200]}", {"status": t.status, "attempt": t.attempt}, kind)


def correctness(c: Context) -> Outcome:
    sec = c.card.correctness
    assert sec is not None
    rep = c.trial.correctness or {}
    numbers = {
        k: rep.get(k) for k in ("method", "max_abs_err", "max_rel_err", "mismatches", "numel") if k in rep
    }
    if sec.require_pass and (c.trial.status == TrialStatus.INCORRECT or rep.get("passed") is False):
        msg = rep.get("message") or "the output does not match the reference"
        return Outcome(FAIL, f"check failed: {msg}"[:300], numbers, "correctness")
    over = []
    for name, limit in sec.max_metrics.items():
        raw = (c.trial.metrics or {}).get(name, rep.get(name))
        if raw is None:
            continue
        value = _number(raw)
        numbers[name] = raw
        if value is None or not math.isfinite(value) or value > limit:
            over.append(f"{name} {raw} > {limit:g}")
    if over:
        return Outcome(FAIL, "; ".join(over), numbers, "correctness")
    return Outcome(PASS, f"correct ({rep.get('method', 'checked')})", numbers)


CONTAMINATED = ("drift", "contended")  # measurement flags (kernels.measure) that make a run suspect


def contaminated(t: TrialRow) -> list[str]:
    return [f for f in t.stats.flags if f in CONTAMINATED]


def load_allowance(c: Context, runs: Sequence[TrialRow | None]) -> float:
    """How far load may have lifted the median of any of these runs: the largest drift among those
    flagged `drift` (kernels.measure.stats.drift_of), 0 if none drifted (jobs.judge.runs.compare_runs)."""
    return max(
        (drift_of(c.samples(t.id)) for t in runs if t is not None and "drift" in t.stats.flags), default=0.0
    )


def comparison(c: Context) -> tuple[RunComparison, dict[str, Any]] | str:
    """The run-level comparison of the trial with its baseline trial (one run each: the run-to-run
    drift is the prior of jobs.judge.runs), or why there is none."""
    if c.baseline is None:
        return "no baseline point for this trial"
    if c.baseline.status != TrialStatus.OK:
        return f"baseline trial #{c.baseline.id} is {c.baseline.status}"
    perf = c.card.performance
    assert perf is not None
    # a run whose process was starved of CPU (kernels.measure's `contended`) tells less about the point:
    # its run-to-run drift is taken larger; one whose samples drifted may read up to that drift slow
    flags = {f"#{t.id}": contaminated(t) for t in (c.baseline, c.trial) if contaminated(t)}
    base, base_dropped = c.timings(c.baseline.id)
    cand, cand_dropped = c.timings(c.trial.id)
    result = compare_runs(
        [base],
        [cand],
        min_effect=c.card.max_slowdown(c.on_cpu),
        alpha=perf.alpha,
        max_cv=c.card.max_cv(c.on_cpu) or DEFAULT_MAX_CV,
        prior=prior_drift(c.on_cpu, contended=any("contended" in f for f in flags.values())),
        inflated=(load_allowance(c, [c.baseline]), load_allowance(c, [c.trial])),
    )
    numbers = {
        "contaminated": flags or None,
        "baseline_trial": c.baseline.id,
        "baseline_job": c.baseline.job_id,
        "baseline_median_ns": c.baseline.median_ns,
        "median_ns": c.trial.median_ns,
        "outliers_dropped": [base_dropped, cand_dropped],
        **result.to_dict(),
    }
    return result, numbers


def verdict_outcome(result: RunComparison, numbers: dict[str, Any], prefix: str = "") -> Outcome:
    ratio = "undefined" if result.run_ratio is None else f"{result.run_ratio:.3f}"
    text = f"{prefix}{result.verdict}: ratio {ratio} ({result.reason})"
    if result.verdict == "slower":
        return Outcome(FAIL, text, numbers, "slower")
    if result.verdict == "faster":
        return Outcome(PASS, text, numbers, "faster")
    if result.verdict == "same":
        return Outcome(PASS, text, numbers)
    return Outcome(AMBIGUOUS, text, numbers, "ambiguous")


def regression(c: Context) -> Outcome:
    found = comparison(c)
    if isinstance(found, str):
        return Outcome(SKIP, found)
    return verdict_outcome(*found)


def hw_fraction(c: Context) -> Outcome:
    perf = c.card.performance
    assert perf is not None and perf.min_hw_fraction is not None
    want = perf.min_hw_fraction
    if c.on_cpu:
        return Outcome(SKIP, "CPU timings: the hardware-limit floor applies on a GPU only")
    limits = limits_for(c.env.device_name if c.env else None)
    if limits is None:
        return Outcome(SKIP, f"no published limits for {c.env.device_name if c.env else '?'}")
    m = c.trial.metrics or {}
    gbps, tflops = _number(m.get("gbps")), _number(m.get("tflops"))
    fractions: dict[str, float] = {}
    if gbps is not None and want.bound in ("memory", "roofline"):
        fractions["memory"] = gbps / limits.hbm_gbps
    if tflops is not None and want.bound in ("compute", "roofline"):
        fractions["compute"] = tflops / limits.dense_tflops[want.compute_dtype]
    if not fractions:
        return Outcome(SKIP, "the trial reports neither gbps nor tflops")
    best = max(fractions.values())
    numbers = {"fractions": fractions, "min": want.min, "limits": limits.name}
    text = f"{best:.1%} of the {limits.name} limit (min {want.min:.0%})"
    return Outcome(
        PASS if best >= want.min else FAIL, text, numbers, None if best >= want.min else "hw_fraction"
    )


def memory(c: Context) -> Outcome:
    sec = c.card.memory
    assert sec is not None
    per_token = _number((c.trial.metrics or {}).get("bytes_per_token"))
    peak = _number((c.trial.memory or {}).get("peak_bytes"))
    base_peak = _number((c.baseline.memory or {}).get("peak_bytes")) if c.baseline else None
    numbers = {"bytes_per_token": per_token, "peak_bytes": peak, "baseline_peak_bytes": base_peak}
    lim = _Limits(numbers)
    lim.check(
        "bytes/token",
        per_token,
        sec.max_bytes_per_token,
        lambda: f"bytes per token {per_token:.0f} > {sec.max_bytes_per_token:.0f}",
    )
    lim.check("peak", peak, sec.max_peak_bytes, lambda: f"peak {peak:.0f} B > {sec.max_peak_bytes:.0f} B")
    growth = peak / base_peak - 1.0 if peak is not None and base_peak else None
    lim.check(
        "peak vs baseline",
        growth,
        sec.max_peak_growth,
        lambda: f"peak {growth:+.1%} over the baseline's (max {sec.max_peak_growth:.0%})",
        "peak_growth",
    )
    return lim.outcome("memory", "the trial reports no memory figure the card limits")


class _Limits:
    """A card section's upper limits on a trial's figures (`numbers`, the outcome's evidence)."""

    def __init__(self, numbers: dict) -> None:
        self.numbers, self.over, self.checked = numbers, [], []

    def check(self, name: str, value: float | None, limit: float | None, says: Callable[[], str],
              key: str | None = None) -> None:  # fmt: skip
        """`value` against `limit` where both are known (`says` words an excess; `key`: the value's
        name among the numbers)."""
        if limit is None or value is None:
            return
        self.checked.append(name)
        if key is not None:
            self.numbers[key] = value
        if value > limit:
            self.over.append(says())

    def outcome(self, anomaly: str, unchecked: str) -> Outcome:
        """FAIL naming each limit exceeded, SKIP (`unchecked` says why) when the trial had a figure for none
        of them, else PASS naming those checked."""
        if self.over:
            return Outcome(FAIL, "; ".join(self.over), self.numbers, anomaly)
        if not self.checked:
            return Outcome(SKIP, unchecked)
        return Outcome(PASS, f"within limits ({', '.join(self.checked)})", self.numbers)


def stability(c: Context) -> Outcome:
    """Whether the samples are quiet enough to back a verdict: their cv (stdev/mean) against max_cv.

    Far outliers (above Q3 + 3 IQR, a preempted call) are dropped first when the card trims, and the cv of
    the rest decides. When more than MAX_TRIMMED of the samples are "far" that is no longer a few
    preemptions: the cv of all the samples decides (a tight core with a second mode a little above it is
    within max_cv; one far above it is not). The cv in the numbers is always the one the reason cites."""
    sec = c.card.stability
    assert sec is not None
    kept, dropped = c.timings(c.trial.id)
    limit = c.card.max_cv(c.on_cpu) or sec.max_cv
    if len(kept) < 2:
        return Outcome(SKIP, "fewer than two samples")
    n = len(kept) + dropped
    many = dropped > MAX_TRIMMED * n
    cv = _cv(c.samples(c.trial.id) if many else kept)
    numbers = {"cv": cv, "max_cv": limit, "n": n, "outliers_dropped": dropped, "cpu": c.on_cpu}
    numbers["cv_raw"] = c.trial.stats.cv
    if many:
        numbers["cv_trimmed"] = _cv(kept)
        text = f"cv {cv:.2%} of all {n} samples"
        if cv <= limit:
            return Outcome(
                PASS, f"{text} <= {limit:.2%} ({dropped} above Q3 + 3 IQR of a tight core, kept)", numbers
            )
        text = (
            f"{dropped} of {n} samples are far outliers (more than {MAX_TRIMMED:.0%}), so none is dropped: "
            f"{text} > {limit:.2%}: too noisy to back a verdict"
        )
        return Outcome(sec.on_exceed, text, numbers, "noisy")
    trimmed = f" ({dropped} far outliers dropped)" if dropped else ""
    if cv <= limit:
        return Outcome(PASS, f"cv {cv:.2%} <= {limit:.2%}{trimmed}", numbers)
    text = f"cv {cv:.2%} > {limit:.2%}{trimmed}: too noisy to back a verdict"
    return Outcome(sec.on_exceed, text, numbers, "noisy")


def _cv(samples: list[int]) -> float:
    x = np.asarray(samples, dtype=np.float64)
    return float(x.std(ddof=1) / x.mean())


def _walk(value: Any, key: str) -> Iterator[Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                yield v
            yield from _walk(v, key)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)


def spills_of(t: TrialRow) -> int | None:
    found = [int(v) for v in _walk(t.resources or {}, "n_spills") if isinstance(v, int)]
    return max(found) if found else None


def occupancy_of(t: TrialRow) -> float | None:
    direct = _number((t.metrics or {}).get("occupancy"))
    if direct is not None:
        return direct
    found = [
        _number(v.get("occupancy")) for v in _walk(t.resources or {}, "occupancy") if isinstance(v, dict)
    ]
    values = [v for v in found if v is not None]
    return min(values) if values else None


def resources(c: Context) -> Outcome:
    sec = c.card.resources
    assert sec is not None
    spills, occ = spills_of(c.trial), occupancy_of(c.trial)
    base_occ = occupancy_of(c.baseline) if c.baseline else None
    numbers = {"n_spills": spills, "occupancy": occ, "baseline_occupancy": base_occ}
    lim = _Limits(numbers)
    lim.check("spills", spills, sec.max_spills, lambda: f"{spills} register spills > {sec.max_spills}")
    drop = 1.0 - occ / base_occ if occ is not None and base_occ else None
    lim.check(
        "occupancy vs baseline",
        drop,
        sec.max_occupancy_drop,
        lambda: f"occupancy {occ:.2f} is {drop:.0%} below the baseline's {base_occ:.2f}",
        "occupancy_drop",
    )
    unchecked = "no compiled-kernel resources recorded (torch backend, CPU or interpreter)"
    return lim.outcome("resource", unchecked)


CHECK_FUNCTIONS: dict[str, Callable[[Context], Outcome]] = {
    "completes": completes,
    "correctness": correctness,
    "regression": regression,
    "hw_fraction": hw_fraction,
    "memory": memory,
    "stability": stability,
    "resources": resources,
}


def run_check(name: str, c: Context) -> Outcome:
    if name != "completes" and not TrialStatus(c.trial.status).measured:
        return Outcome(SKIP, f"the trial did not finish ({c.trial.status})")
    if name in ("regression", "stability", "hw_fraction") and c.trial.status == TrialStatus.INCORRECT:
        return Outcome(SKIP, "the trial is incorrect: its timing is not judged")
    return CHECK_FUNCTIONS[name](c)


# ---- scoped checks (the card's `checks:`, promoted from reviewed drafts) --------------------------------
def in_scope(chk: CardCheck, t: TrialRow) -> bool:
    s = chk.scope
    if (s.family and s.family != t.family) or (s.backend and s.backend != t.backend):
        return False
    if s.dtype and s.dtype != t.dtype:
        return False
    shape = t.shape or {}
    return s.shapes is None or any(all(shape.get(k) == v for k, v in want.items()) for want in s.shapes)


def check_metric(metric: str, c: Context) -> tuple[float | None, str]:
    """The value of one CHECK_METRICS metric on the context's trial, or None and why there is none."""
    t = c.trial
    rep = t.correctness or {}
    if metric == "completes":
        return (0.0 if TrialStatus(t.status) in _UNFINISHED else 1.0), t.status
    if metric == "correct":
        bad = t.status == TrialStatus.INCORRECT or rep.get("passed") is False
        return (0.0 if bad else 1.0), "the reference check"
    if metric == "cv":
        kept, _dropped = c.timings(t.id)
        return (_cv(kept), "") if len(kept) >= 2 else (None, "fewer than two samples")
    if metric == "median_ns":
        return _number(t.median_ns), "no median stored"
    if metric == "ratio":
        found = comparison(c)
        if isinstance(found, str):
            return None, found
        return found[0].run_ratio, found[0].reason
    if metric in ("max_abs_err", "max_rel_err"):
        return _number((t.metrics or {}).get(metric, rep.get(metric))), "no correctness report"
    if metric == "peak_bytes":
        return _number((t.memory or {}).get("peak_bytes")), "no peak memory recorded"
    if metric == "n_spills":
        spills = spills_of(t)
        return (None if spills is None else float(spills)), "no compiled-kernel resources recorded"
    if metric == "occupancy":
        return occupancy_of(t), "no occupancy recorded"
    return _number((t.metrics or {}).get(metric)), f"the trial reports no {metric}"


_UNFINISHED = (TrialStatus.TIMEOUT, TrialStatus.CRASHED, TrialStatus.ERROR)
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: a == b,
}


def card_check(chk: CardCheck, c: Context) -> Outcome:
    """A scoped check on one trial in its scope: pass, fail, or skip when the metric cannot be read."""
    if chk.metric != "completes" and not TrialStatus(c.trial.status).measured:
        return Outcome(SKIP, f"the trial did not finish ({c.trial.status})")
    if chk.metric not in ("completes", "correct") and c.trial.status == TrialStatus.INCORRECT:
        return Outcome(SKIP, "the trial is incorrect: its numbers are not judged")
    value, why = check_metric(chk.metric, c)
    numbers = {"metric": chk.metric, "value": value, "op": chk.op, "threshold": chk.threshold}
    if chk.draft:
        numbers["draft"] = chk.draft
    if value is None or not math.isfinite(value):
        return Outcome(SKIP, f"{chk.metric}: not measured ({why})", numbers)
    text = f"{chk.metric} {value:.4g} {chk.op} {chk.threshold:g}"
    if _OPS[chk.op](value, chk.threshold):
        return Outcome(PASS, text, numbers)
    return Outcome(FAIL, f"{chk.metric} {value:.4g}, expected {chk.op} {chk.threshold:g}", numbers)
