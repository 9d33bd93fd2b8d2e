"""Metric cards: what a CI step asserts about a job, one YAML file per kernel family under jobs/cards/.

A card has sections (correctness, performance, memory, stability, resources), each a set of thresholds,
and an `assertions` list naming the checks the CI step runs, in order. Every check is evaluated per trial
(see jobs.judge.acceptance). Checks and the section each needs:

  completes    every trial finished: not a timeout, a crash or an error          (no section)
  correctness  the trial's correctness report passed on every seed, and the
               named metrics are under their limits                              correctness
  regression   median of raw samples against the matching baseline trial
               (kernels.measure.stats.compare_samples; min effect = max_slowdown)        performance
  hw_fraction  on a GPU, the fraction of the hardware limit reached              performance.min_hw_fraction
  memory       bytes per token and peak bytes under the card's limits            memory
  stability    coefficient of variation of the samples under max_cv              stability
  resources    register spills and occupancy against the limits / the baseline   resources

Besides the named checks, `checks:` lists scoped checks, each one metric of a trial (CHECK_METRICS)
against a threshold, on the trials in its scope (family, backend, shapes, dtype; unset: every trial). They
come from reviewed drafts (`farm drafts promote`, with the draft's id) and run after the assertions, each
as the assertion `draft-<id>` (or `<metric><op><threshold>` without a draft).

CPU timings are labelled as such and are noisier than a GPU's: the `cpu` section overrides max_slowdown
and max_cv when the trial ran on a CPU, and `cpu.ambiguous` (warn | fail; default warn) says what an
ambiguous assertion does to the verdict of a job timed on a CPU when the command does not say
(`--ambiguous`): on a shared CPU, "too noisy to call" is the common case, not a failure.
`trim_outliers` (never | cpu | always; default cpu) drops far
outliers, samples above Q3 + 3 IQR (a call the OS preempted), before the regression comparison and the
stability check; the medians barely move, the dispersion stops being one preemption's, and the number
dropped is reported with the numbers (when more than MAX_TRIMMED of the samples are beyond the fence, the
stability check judges the cv of all of them instead).
Unknown keys are errors; every error names the file and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jobs.spec.validation import InvalidFile, problems_from

CARDS_DIR = Path(__file__).resolve().parents[1] / "cards"
CHECKS = ("completes", "correctness", "regression", "hw_fraction", "memory", "stability", "resources")


class CardError(InvalidFile):
    WHAT = "metric card"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Correctness(_Strict):
    require_pass: bool = Field(True, description="the trial's correctness report passed on all seeds")
    max_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="metric name -> largest allowed value (looked up in metrics, then in correctness)",
    )


class HwFraction(_Strict):
    min: float = Field(gt=0, le=1, description="least fraction of the hardware limit reached")
    bound: Literal["memory", "compute", "roofline"] = Field(
        "roofline", description="memory: GB/s over HBM; compute: TFLOPS over peak; roofline: the larger"
    )
    compute_dtype: Literal["bf16", "fp8"] = "bf16"


class Performance(_Strict):
    max_slowdown: float = Field(
        gt=0, lt=1, description="fail when median(candidate)/median(baseline) - 1 exceeds this, significantly"
    )
    alpha: float = Field(0.002, gt=0, lt=1, description="Mann-Whitney significance level")
    min_hw_fraction: HwFraction | None = None


class Memory(_Strict):
    max_bytes_per_token: float | None = Field(None, gt=0, description="metrics.bytes_per_token")
    max_peak_bytes: float | None = Field(None, gt=0, description="memory.peak_bytes")
    max_peak_growth: float | None = Field(
        None, ge=0, description="memory.peak_bytes over the baseline trial's, minus 1"
    )


class Stability(_Strict):
    max_cv: float = Field(gt=0, lt=1, description="stdev/mean of the kept samples")
    on_exceed: Literal["ambiguous", "fail"] = Field(
        "ambiguous", description="a noisy measurement cannot back a verdict: ambiguous, or a hard fail"
    )


class Resources(_Strict):
    max_spills: int | None = Field(None, ge=0, description="register spills of any compiled kernel")
    max_occupancy_drop: float | None = Field(
        None, ge=0, lt=1, description="occupancy below the baseline trial's by more than this fraction"
    )


class CpuOverrides(_Strict):
    max_slowdown: float | None = Field(None, gt=0, lt=1)
    max_cv: float | None = Field(None, gt=0, lt=1)
    ambiguous: Literal["warn", "fail"] = "warn"  # on CPU timings, unless the command says otherwise


_NEEDS: dict[str, str] = {
    "correctness": "correctness",
    "regression": "performance",
    "memory": "memory",
    "stability": "stability",
    "resources": "resources",
}


# metric -> what it reads from a trial (jobs.judge.checks.check_metric); a draft's check names one of these
CHECK_METRICS: dict[str, str] = {
    "cv": "coefficient of variation of the kept samples (far outliers dropped when the card trims)",
    "median_ns": "median of the kept samples, in ns",
    "ratio": "run-level median ratio to the matching baseline trial",
    "correct": "1 when the output matched the reference on every seed, else 0",
    "completes": "1 when the trial finished (not a timeout, crash or error), else 0",
    "max_abs_err": "largest absolute error against the reference",
    "max_rel_err": "largest relative error against the reference",
    "bytes_per_token": "metrics.bytes_per_token",
    "peak_bytes": "memory.peak_bytes",
    "n_spills": "register spills of any compiled kernel",
    "occupancy": "occupancy of the compiled kernel",
    "tflops": "metrics.tflops",
    "gbps": "metrics.gbps",
}
CHECK_OPS = ("<=", "<", ">=", ">", "==")
Scalar = str | int | float | bool | None


class CheckScope(_Strict):
    family: str | None = None
    backend: str | None = None
    shapes: list[dict[str, Scalar]] | None = Field(
        None, min_length=1, description="the shapes it applies to (each may name only some keys)"
    )
    dtype: str | None = None


class CardCheck(_Strict):
    """One scoped check: `metric op threshold` on every trial in `scope`."""

    metric: Literal[tuple(CHECK_METRICS)]  # type: ignore[valid-type]
    op: Literal[CHECK_OPS]  # type: ignore[valid-type]
    threshold: float = Field(allow_inf_nan=False)
    scope: CheckScope = Field(default_factory=CheckScope)
    draft: int | None = Field(None, ge=1, description="the draft it was promoted from")

    @property
    def name(self) -> str:
        return f"draft-{self.draft}" if self.draft else f"{self.metric}{self.op}{self.threshold:g}"

    def text(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


class Card(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    family: str | None = Field(None, description="the family it applies to; None: any")
    description: str = ""
    assertions: list[Literal[CHECKS]] = Field(min_length=1)  # type: ignore[valid-type]
    correctness: Correctness | None = None
    performance: Performance | None = None
    memory: Memory | None = None
    stability: Stability | None = None
    resources: Resources | None = None
    cpu: CpuOverrides = Field(default_factory=CpuOverrides)
    trim_outliers: Literal["never", "cpu", "always"] = "cpu"
    checks: list[CardCheck] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sections_present(self) -> Card:
        dupes = sorted({a for a in self.assertions if self.assertions.count(a) > 1})
        if dupes:
            raise ValueError(f"assertions: listed twice: {dupes}")
        for check in self.assertions:
            section = _NEEDS.get(check)
            if section and getattr(self, section) is None:
                raise ValueError(f"assertions: {check!r} needs a `{section}:` section")
        if "hw_fraction" in self.assertions and (
            self.performance is None or self.performance.min_hw_fraction is None
        ):
            raise ValueError("assertions: 'hw_fraction' needs performance.min_hw_fraction")
        for i, chk in enumerate(self.checks):
            if self.family and chk.scope.family not in (None, self.family):
                raise ValueError(f"checks.{i}.scope.family: {chk.scope.family!r} on a card for {self.family}")
        return self

    def max_slowdown(self, on_cpu: bool) -> float:
        assert self.performance is not None
        return (self.cpu.max_slowdown if on_cpu else None) or self.performance.max_slowdown

    def trims(self, on_cpu: bool) -> bool:
        return self.trim_outliers == "always" or (self.trim_outliers == "cpu" and on_cpu)

    def max_cv(self, on_cpu: bool) -> float | None:
        base = self.stability.max_cv if self.stability else None
        return (self.cpu.max_cv if on_cpu else None) or base


def parse_card(data: Any, source: str = "<card>") -> Card:
    if not isinstance(data, dict):
        raise CardError(
            source, [f"(top level): expected a mapping of card fields (got {type(data).__name__})"]
        )
    try:
        return Card.model_validate(data)
    except ValidationError as err:
        raise CardError(source, problems_from(err, data)) from None


def parse_check(data: Any, card: Card | None = None, source: str = "<check>") -> CardCheck:
    """A scoped check in the card's grammar, validated as the card would (CardError names each problem);
    with `card`, also against that card (its family)."""
    if not isinstance(data, dict):
        raise CardError(
            source, [f"(top level): expected a mapping of check fields (got {type(data).__name__})"]
        )
    try:
        chk = CardCheck.model_validate(data)
    except ValidationError as err:
        raise CardError(source, problems_from(err, data)) from None
    if card is not None and card.family and chk.scope.family not in (None, card.family):
        raise CardError(
            source, [f"scope.family: {chk.scope.family!r}, but card {card.name} is for {card.family}"]
        )
    return chk


def load_card(name_or_path: str | Path) -> Card:
    """A card by name (jobs/cards/<name>.yaml) or by the path of a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CARDS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in CARDS_DIR.glob("*.yaml")))
            raise CardError(str(name_or_path), [f"no such card (known: {known})"])
    try:
        text = path.read_text()
    except OSError as err:
        raise CardError(str(path), [f"cannot read the file: {err.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise CardError(str(path), [f"{where}not valid YAML: {getattr(err, 'problem', err)}"]) from None
    return parse_card(data, str(path))


def all_cards() -> dict[str, Card]:
    return {p.stem: load_card(p) for p in sorted(CARDS_DIR.glob("*.yaml"))}
