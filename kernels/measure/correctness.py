"""Correctness checks of a kernel's output against a reference, each returning a CorrectnessReport.

  check_flashmla   per element: pass if abs err <= atol OR rel err <= rtol; plus a cosine-style diff
                   (1 - 2 sum(xy) / sum(x^2 + y^2), float64) <= max_cos_diff; NaN / +inf / -inf positions
                   must match exactly (the FlashMLA reference tests' rule; defaults are its `out` limits).
  check_calc_diff  DeepGEMM's calc_diff in float64, pass below a threshold (1e-3 by default).
  check_allclose   |out - ref| <= atol + rtol |ref| per element, per-dtype default tolerances, NaN
                   positions must match.
All report max abs error, max relative error, the number of mismatching elements and the worst index.
`combine_seeds` folds per-seed reports into one (all must pass); `poison_like` / `fill_nan` fill memory a
kernel must not read so that stray reads show up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

# (atol, rtol) per dtype for check_allclose; the lower-precision dtype of the two tensors decides.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-6),
    torch.float16: (1e-5, 1e-3),
    torch.bfloat16: (1e-5, 1.6e-2),
    torch.float8_e4m3fn: (1e-3, 1.25e-1),
    torch.float8_e5m2: (1e-3, 2.5e-1),
}
_PRECISION_ORDER = [torch.float8_e5m2, torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32]

FLASHMLA_OUT = {"atol": 8e-4, "rtol": 2.01 / 128, "max_cos_diff": 5e-6}
FLASHMLA_LSE = {"atol": 1e-6, "rtol": 8.01 / 65536, "max_cos_diff": 5e-6}


@dataclass(frozen=True)
class CorrectnessReport:
    passed: bool
    method: str  # "flashmla" | "calc_diff" | "allclose"
    max_abs_err: float
    max_rel_err: float
    mismatches: int  # elements failing the per-element rule (incl. NaN/inf position mismatches)
    worst_index: tuple[int, ...] | None
    numel: int
    nonfinite_mismatches: int = 0
    atol: float | None = None
    rtol: float | None = None
    cos_diff: float | None = None
    calc_diff: float | None = None
    threshold: float | None = None
    message: str = ""
    seed: int | None = None
    per_seed: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = str(value)  # "nan" / "inf": JSON has no NaN
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim)
        flat //= dim
    return tuple(int(i) for i in reversed(index))


def _shape_mismatch(method: str, out: torch.Tensor, ref: torch.Tensor) -> CorrectnessReport | None:
    if out.shape == ref.shape:
        return None
    return CorrectnessReport(
        False, method, math.inf, math.inf, max(out.numel(), ref.numel()), None, ref.numel(),
        message=f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}",
    )  # fmt: skip


def _nonfinite_mismatch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Boolean mask: positions where NaN, +inf or -inf appear in one tensor but not the other."""
    return (
        (torch.isnan(x) != torch.isnan(y))
        | (torch.isposinf(x) != torch.isposinf(y))
        | (torch.isneginf(x) != torch.isneginf(y))
    )


@dataclass
class _Errors:
    abs_err: torch.Tensor  # 0 where both are the same non-finite value; inf where they disagree
    rel_err: torch.Tensor
    bad_nonfinite: torch.Tensor
    finite: torch.Tensor  # both finite


def _errors(out: torch.Tensor, ref: torch.Tensor) -> _Errors:
    x = out.detach().to(torch.float64).flatten()
    y = ref.detach().to(torch.float64).flatten()
    bad = _nonfinite_mismatch(x, y)
    finite = torch.isfinite(x) & torch.isfinite(y)
    diff = torch.where(finite, (x - y).abs(), torch.zeros_like(x))
    abs_err = torch.where(bad, torch.full_like(x, math.inf), diff)
    denom = y.abs()
    rel = torch.where(denom > 0, diff / denom, torch.where(diff > 0, math.inf, 0.0))
    rel_err = torch.where(bad, torch.full_like(x, math.inf), rel)
    return _Errors(abs_err, rel_err, bad, finite)


def _worst(errors: _Errors, failing: torch.Tensor, shape: torch.Size) -> tuple[int, ...] | None:
    """Index of the worst element: a failing one if any (largest abs error), else the largest error."""
    if errors.abs_err.numel() == 0:
        return None
    pool = failing if bool(failing.any()) else torch.ones_like(failing)
    score = torch.where(pool, errors.abs_err, torch.full_like(errors.abs_err, -1.0))
    return _unravel(int(torch.argmax(score)), shape)


def _max(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def _report(
    method: str,
    e: _Errors,
    failing: torch.Tensor,
    mismatches: int,
    out: torch.Tensor,
    *,
    passed: bool,
    message: str,
    **limits: float,
) -> CorrectnessReport:
    """The report every check writes: its verdict and message, the error maxima, the worst element
    (among `failing` if any fail), the NaN/inf position mismatches and the check's own limits."""
    return CorrectnessReport(
        passed=passed,
        method=method,
        max_abs_err=_max(e.abs_err),
        max_rel_err=_max(e.rel_err),
        mismatches=mismatches,
        worst_index=_worst(e, failing, out.shape),
        numel=out.numel(),
        nonfinite_mismatches=int(e.bad_nonfinite.sum()),
        message=message,
        **limits,
    )


def cos_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2 sum(x y) / sum(x^2 + y^2) in float64 (0 for identical tensors, including all-zero ones)."""
    a = x.detach().to(torch.float64)
    b = y.detach().to(torch.float64)
    denom = float((a * a + b * b).sum())
    if denom == 0.0:
        return 0.0 if bool(torch.equal(a, b)) else math.inf
    return 1.0 - 2.0 * float((a * b).sum()) / denom


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity measure: 1 - 2 sum(x y) / sum(x^2 + y^2), float64. NaN if any is NaN."""
    return cos_diff(x, y)


def check_flashmla(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float = FLASHMLA_OUT["atol"],
    rtol: float = FLASHMLA_OUT["rtol"],
    max_cos_diff: float = FLASHMLA_OUT["max_cos_diff"],
) -> CorrectnessReport:
    """FlashMLA-style check; use FLASHMLA_LSE's limits for the log-sum-exp output."""
    if (bad := _shape_mismatch("flashmla", out, ref)) is not None:
        return bad
    e = _errors(out, ref)
    failing = e.bad_nonfinite | ~((e.abs_err <= atol) | (e.rel_err <= rtol))
    mismatches = int(failing.sum())
    n_bad = int(e.bad_nonfinite.sum())
    cd = cos_diff(out.flatten()[e.finite], ref.flatten()[e.finite])
    passed = mismatches == 0 and cd <= max_cos_diff
    problems = []
    if n_bad:
        problems.append(f"{n_bad} NaN/inf position mismatches")
    if mismatches > n_bad:
        problems.append(f"{mismatches - n_bad} elements beyond atol {atol:g} and rtol {rtol:g}")
    if not cd <= max_cos_diff:
        problems.append(f"cos_diff {cd:.3g} > {max_cos_diff:g}")
    msg = "; ".join(problems) if problems else "ok"
    return _report(
        "flashmla", e, failing, mismatches, out, passed=passed, message=msg,
        atol=atol, rtol=rtol, cos_diff=cd, threshold=max_cos_diff,
    )  # fmt: skip


def check_calc_diff(out: torch.Tensor, ref: torch.Tensor, *, threshold: float = 1e-3) -> CorrectnessReport:
    """DeepGEMM-style check: pass when calc_diff(out, ref) < threshold. `mismatches` counts NaN/inf
    position mismatches only; the per-element errors are reported for diagnosis."""
    if (bad := _shape_mismatch("calc_diff", out, ref)) is not None:
        return bad
    e = _errors(out, ref)
    diff = calc_diff(out, ref)
    n_bad = int(e.bad_nonfinite.sum())
    passed = n_bad == 0 and diff < threshold  # NaN fails: NaN < threshold is False
    msg = (
        "ok"
        if passed
        else f"calc_diff {diff:.3g} not below {threshold:g}"
        + (f"; {n_bad} NaN/inf position mismatches" if n_bad else "")
    )
    return _report(
        "calc_diff",
        e,
        e.bad_nonfinite,
        n_bad,
        out,
        passed=passed,
        message=msg,
        calc_diff=diff,
        threshold=threshold,
    )


def default_tolerances(*dtypes: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for the lowest-precision floating dtype among `dtypes` (float32's for integers)."""
    ranked = [d for d in _PRECISION_ORDER if d in dtypes]
    if ranked:
        return DEFAULT_TOLERANCES[ranked[0]]
    if torch.float64 in dtypes and all(d == torch.float64 or not d.is_floating_point for d in dtypes):
        return DEFAULT_TOLERANCES[torch.float64]
    return DEFAULT_TOLERANCES[torch.float32]


def check_allclose(
    out: torch.Tensor, ref: torch.Tensor, *, atol: float | None = None, rtol: float | None = None
) -> CorrectnessReport:
    if (bad := _shape_mismatch("allclose", out, ref)) is not None:
        return bad
    d_atol, d_rtol = default_tolerances(out.dtype, ref.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    e = _errors(out, ref)
    limit = atol + rtol * ref.detach().to(torch.float64).flatten().abs()
    failing = e.bad_nonfinite | (e.finite & (e.abs_err > limit))
    mismatches = int(failing.sum())
    msg = "ok" if mismatches == 0 else f"{mismatches} elements beyond atol {atol:g} + rtol {rtol:g}"
    return _report(
        "allclose", e, failing, mismatches, out, passed=mismatches == 0, message=msg, atol=atol, rtol=rtol
    )


def combine_seeds(
    reports: Sequence[CorrectnessReport], seeds: Sequence[int] | None = None
) -> CorrectnessReport:
    """One report over several seeds: passes only if every seed passed (and there is at least one).
    The headline fields are those of the worst seed (first failing one, else the largest abs error);
    mismatches are summed; every seed's report is kept under per_seed."""
    if not reports:
        return CorrectnessReport(False, "none", math.nan, math.nan, 0, None, 0, message="no seeds checked")
    seeds = (
        list(seeds)
        if seeds is not None
        else [r.seed if r.seed is not None else i for i, r in enumerate(reports)]
    )
    if len(seeds) != len(reports):
        raise ValueError(f"{len(seeds)} seeds for {len(reports)} reports")
    failing = [i for i, r in enumerate(reports) if not r.passed]
    worst = failing[0] if failing else max(range(len(reports)), key=lambda i: reports[i].max_abs_err)
    per_seed = [{**r.to_dict(), "seed": s, "per_seed": []} for r, s in zip(reports, seeds, strict=True)]
    passed = not failing
    message = "ok on all seeds" if passed else (
        f"failed on seeds {[seeds[i] for i in failing]}: {reports[worst].message}"
    )  # fmt: skip
    return replace(
        reports[worst],
        passed=passed,
        mismatches=sum(r.mismatches for r in reports),
        max_abs_err=max(r.max_abs_err for r in reports),
        max_rel_err=max(r.max_rel_err for r in reports),
        seed=seeds[worst],
        message=message,
        per_seed=per_seed,
    )


def seed_list(n: int, base: int = 0) -> list[int]:
    """The seeds a trial checks correctness on (n >= 1)."""
    if n < 1:
        raise ValueError(f"need at least one seed, got {n}")
    return [base + i for i in range(n)]


# -- poisoning memory a kernel must not read ---------------------------------------------------------------


def poison_value(dtype: torch.dtype) -> float | int:
    """NaN for floating dtypes that have one; the largest value for integers (a huge, out-of-range id)."""
    if dtype.is_floating_point:
        return math.nan
    if dtype == torch.bool:
        return True
    return int(torch.iinfo(dtype).max)


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor like `t` filled with its poison value (NaN, or the integer max)."""
    return torch.full_like(t, poison_value(t.dtype))


def fill_nan(t: torch.Tensor, where: torch.Tensor | slice | tuple | None = None) -> torch.Tensor:
    """Poison `t` in place: all of it, or the positions `where` selects (a mask or an index). Returns t."""
    value = poison_value(t.dtype)
    if where is None:
        t.fill_(value)
    else:
        t[where] = value
    return t
