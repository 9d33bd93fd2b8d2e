"""Sweep specs: a YAML file validated with pydantic and expanded into trials.

A spec names a kernel family, its backends (exactly one is the baseline), a shape grid and a config
grid (each a cartesian product with include/exclude rules), dtypes, the measurement policy, a
per-trial timeout and the acceptance card to apply. Every error names the file, the field path and
the bad value, and is raised before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from jobs.spec.strict_yaml import load_strict
from jobs.spec.validation import InvalidFile, problems_from
from kernels.base import KernelFamily, TrialRequest, trial_label
from kernels.measure.policy import MeasurePolicy
from kernels.registry import UnknownFamily, get_family

Scalar = int | float | str | bool
Point = dict[str, Scalar]
Axis = Annotated[list[Scalar], Field(min_length=1)]

DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")


class SpecError(InvalidFile):
    """A spec that cannot run. `problems` holds one `path: message (got value)` line per fault."""

    WHAT = "sweep spec"


class TooManyTrials(ValueError):
    """The grid expands to more trials than the caller accepts (`farm sweep --max-trials`): raised by
    load_spec before the trials are checked one by one against the family, so a huge grid is refused in
    the time it takes to read it. `total` is the count."""

    def __init__(self, source: str, total: int, limit: int) -> None:
        self.source, self.total, self.limit = source, total, limit
        super().__init__(f"{source}: the grid expands to {total:,} trials, more than {limit:,}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Grid(_Strict):
    """`grid` is expanded as a cartesian product; `exclude` drops every point that matches all keys
    of one rule; `include` adds whole points (after exclusion)."""

    grid: dict[str, Axis] = Field(default_factory=dict)
    include: list[Point] = Field(default_factory=list)
    exclude: list[Point] = Field(default_factory=list)

    def points(self) -> list[Point]:
        return list(self.iter_points())

    def iter_points(self) -> Iterator[Point]:
        """The points one at a time (a large grid is never held in memory): the product of the axes
        (each axis's repeated values once) minus the excluded, then the included not already there."""
        keys = list(self.grid)
        axes = [list(dict.fromkeys(values)) for values in self.grid.values()]
        if keys or not self.include:  # no axes: one empty point, unless the points are all given by include
            for combo in itertools.product(*axes):
                point = dict(zip(keys, combo, strict=True))
                if not self._excluded(point):
                    yield point
        seen: set[str] = set()
        for point in self.include:
            ident = json.dumps(point, sort_keys=True)
            if ident not in seen and not (keys and self._in_product(point)):
                seen.add(ident)
                yield point

    def count(self) -> int:
        if self.exclude:
            return sum(1 for _ in self.iter_points())
        # no exclusion: the product of the axes (each value once) and the included points not in it,
        # counted without making the product's points (10^6 of them take a second and a half)
        keys = list(self.grid)
        total = math.prod(len(dict.fromkeys(values)) for values in self.grid.values()) if keys else 0
        if not keys and not self.include:
            return 1  # no axes and nothing included: one empty point
        seen: set[str] = set()
        for point in self.include:
            ident = json.dumps(point, sort_keys=True)
            if ident not in seen and not (keys and self._in_product(point)):
                seen.add(ident)
                total += 1
        return total

    def _excluded(self, point: Point) -> bool:
        return any(_matches(point, rule) for rule in self.exclude)

    def _in_product(self, point: Point) -> bool:
        """Whether the product part of iter_points already yields this point."""
        return (
            set(point) == set(self.grid)
            and all(point[k] in self.grid[k] for k in self.grid)
            and not self._excluded(point)
        )


def _matches(point: Point, rule: Point) -> bool:
    return all(k in point and point[k] == v for k, v in rule.items())


class Backend(_Strict):
    name: str = Field(min_length=1)
    baseline: bool = False
    shapes: Grid | None = None  # overrides the spec's shape grid for this backend
    configs: Grid | None = None  # overrides the spec's config grid for this backend


class GpuNeed(_Strict):
    """The GPU a job's trials need (`farm submit`'s pool places them only on matching workers): a type as
    Ray's `accelerator_type:<type>` resource names it (H100, H200, ...) and/or a minimum memory."""

    type: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    min_memory_gb: float | None = Field(None, gt=0)


class SweepSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    family: str
    description: str = ""
    backends: list[Backend] = Field(min_length=1)
    shapes: Grid
    configs: Grid = Field(default_factory=Grid)
    dtypes: list[str] = Field(default_factory=lambda: ["float32"], min_length=1)
    measure: MeasurePolicy = Field(default_factory=MeasurePolicy)
    timeout_s: float = Field(300.0, gt=0, description="per-trial timeout; the worker is killed past it")
    max_attempts: int = Field(3, ge=1, le=10, description="attempts for a trial whose worker dies")
    tags: list[str] = Field(default_factory=list)
    card: str | None = None  # the metric card `farm sweep run` and `farm accept` judge the job by
    # After acceptance, draft acceptance checklists for the anomalies through the gateway (the built-in
    # offline drafter when no gateway key is set): "checklist" or "log_summary".
    drafts: Literal["checklist", "log_summary"] | None = None
    # A webhook told the verdict when the job ends in the pool (`farm submit`; Slack-compatible JSON). Not
    # part of what is measured: spec_hash leaves it out.
    notify: str | None = Field(None, pattern=r"^https?://\S+$")
    gpu: GpuNeed | None = None  # the GPU its trials need in a pool (None: any worker)
    _trials: tuple[TrialSpec, ...] | None = PrivateAttr(default=None)  # the grid, expanded once

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes: list[str]) -> list[str]:
        for d in dtypes:
            if d not in DTYPES:
                raise ValueError(f"unknown dtype {d!r} (known: {', '.join(DTYPES)})")
        return dtypes

    @model_validator(mode="after")
    def _one_baseline(self) -> SweepSpec:
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"backends: duplicate backend names {dupes}")
        marked = [b.name for b in self.backends if b.baseline]
        if len(self.backends) == 1 and not marked:
            self.backends[0].baseline = True
        elif len(marked) != 1:
            raise ValueError(
                f"backends: exactly one backend must be marked baseline: true (marked: {marked})"
            )
        return self

    @property
    def baseline(self) -> str:
        return next(b.name for b in self.backends if b.baseline)

    def spec_hash(self) -> str:
        unset = {"gpu"} if self.gpu is None else set()  # specs without one hash as they always did
        measured = self.model_dump(mode="json", exclude={"notify", *unset})
        canonical = json.dumps(measured, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def trials(self) -> list[TrialSpec]:
        """The grid's points in order, expanded once per spec (a spec is not changed after loading).
        A large grid is better walked with `iter_trials`, which holds one point at a time."""
        if self._trials is None:
            self._trials = tuple(_expand(self))
        return list(self._trials)

    def iter_trials(self) -> Iterator[TrialSpec]:
        return iter(self._trials) if self._trials is not None else _expand(self)

    def count_trials(self) -> int:
        if self._trials is not None:
            return len(self._trials)
        total = 0
        for b in self.backends:
            total += (b.shapes or self.shapes).count() * (b.configs or self.configs).count()
        return total * len(self.dtypes)


@dataclass(frozen=True)
class TrialSpec:
    """One point of the sweep's grid: a backend run on one shape, config and dtype. Stored as a
    jobs.store.TrialRow; sent to a worker as a kernels.base.TrialRequest."""

    family: str
    backend: str
    shape: Point
    config: Point
    dtype: str
    baseline: bool

    @property
    def key(self) -> str:
        """Stable identity inside a job: the same point always has the same key."""
        ident = [
            self.family,
            self.backend,
            sorted(self.shape.items()),
            sorted(self.config.items()),
            self.dtype,
        ]
        return hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:20]

    def label(self) -> str:
        return trial_label(self.backend, self.shape, self.config, self.dtype)

    def request(self, policy: MeasurePolicy) -> TrialRequest:
        return TrialRequest(self.family, self.backend, self.shape, self.config, self.dtype, policy=policy)


def _canonical(family_name: str) -> Callable[[Point], Point]:
    """The family's canonical form of a shape point (KernelFamily.canonical_shape): how it is stored."""
    try:
        return get_family(family_name).canonical_shape
    except UnknownFamily:  # parse_spec names it; a spec built without parsing keeps its points
        return lambda shape: shape


def _expand(spec: SweepSpec) -> Iterator[TrialSpec]:
    canonical = _canonical(spec.family)
    for backend in spec.backends:
        configs = (backend.configs or spec.configs).points()  # the smaller grid, held; shapes stream
        for point in (backend.shapes or spec.shapes).iter_points():
            shape = canonical(point)
            for config, dtype in itertools.product(configs, spec.dtypes):
                yield TrialSpec(spec.family, backend.name, shape, config, dtype, backend.baseline)


def _same_points(family: KernelFamily, grid: Grid, where: str) -> list[str]:
    """Points of one grid that the family's canonical form makes one (fp8_gemm: scale_group 128 written
    out and left out): two trials of one key. Only for a family with a canonical form of its own."""
    if type(family).canonical_shape is KernelFamily.canonical_shape:
        return []
    first: dict[str, Point] = {}
    problems = []
    for point in grid.iter_points():
        stored = family.canonical_shape(point)
        ident = json.dumps(stored, sort_keys=True, default=str)
        if ident in first:
            problems.append(f"{where}: {point} is the same point as {first[ident]} (both are {stored})")
        else:
            first[ident] = point
    return problems


# --------------------------------------------------------------------------------------------------
# Loading


def parse_spec(data: Any, source: str = "<spec>", *, max_trials: int | None = None) -> SweepSpec:
    """Validate a spec given as plain data; raise SpecError naming every bad field (TooManyTrials when
    the grid has more than `max_trials`, before each trial is checked against the family)."""
    if not isinstance(data, dict):
        raise SpecError(
            source, [f"(top level): expected a mapping of spec fields (got {type(data).__name__})"]
        )
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, problems_from(err, data)) from None
    _check_against_family(spec, source, max_trials)
    return spec


def _check_against_family(spec: SweepSpec, source: str, max_trials: int | None = None) -> None:
    try:
        family = get_family(spec.family)
    except UnknownFamily as err:
        raise SpecError(source, [f"family: {err} (got {spec.family!r})"]) from None
    problems = []
    for i, b in enumerate(spec.backends):
        if b.name not in family.backends:
            known = ", ".join(sorted(family.backends))
            problems.append(
                f"backends[{i}].name: unknown backend for family {spec.family} (known: {known}) "
                f"(got {b.name!r})"
            )
    checked: set[int] = set()
    for i, b in enumerate(spec.backends):
        where = f"backends[{i}].shapes" if b.shapes is not None else "shapes"
        grid = b.shapes or spec.shapes
        if next(grid.iter_points(), None) is None:
            problems.append(f"{where}: the grid expands to no points after exclude")
        elif id(grid) not in checked:  # the spec's own grid once
            checked.add(id(grid))
            problems.extend(_same_points(family, grid, where))
    for i, b in enumerate(spec.backends):
        where = f"backends[{i}].configs" if b.configs is not None else "configs"
        if next((b.configs or spec.configs).iter_points(), None) is None:
            problems.append(f"{where}: the grid expands to no points after exclude")
    if spec.card is not None:
        from jobs.spec.cards import (  # jobs.spec.cards reuses this module's error formatting
            CardError,
            load_card,
        )

        try:
            load_card(spec.card)
        except CardError as err:
            problems.append(f"card: {'; '.join(err.problems)} (got {spec.card!r})")
    if problems:
        raise SpecError(source, list(dict.fromkeys(problems)))
    if max_trials is not None and (total := spec.count_trials()) > max_trials:
        raise TooManyTrials(source, total, max_trials)
    seen: set[str] = set()
    for t in spec.iter_trials():
        try:
            family.validate(t.shape, t.config, t.dtype, t.backend)
        except ValueError as err:
            msg = f"{t.label()}: {err}"
            if msg not in seen:
                seen.add(msg)
                problems.append(msg)
    if problems:
        raise SpecError(
            source, problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        )


# A spec is written by hand: a file larger than this is refused before it is parsed (a grid of any size
# fits in a few lines as axes; 10^6 points listed one by one are 18 MB of YAML and seconds of parsing).
MAX_SPEC_BYTES = 4 * 1024 * 1024


def load_spec(path: str | Path, *, max_trials: int | None = None) -> SweepSpec:
    """The spec of a file; `max_trials`: a grid of more trials raises TooManyTrials before its trials
    are checked against the family one by one. A file over MAX_SPEC_BYTES is refused unread."""
    path = Path(path)
    source = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            limit = MAX_SPEC_BYTES / 2**20
            raise SpecError(source, [
                f"the file is {size / 2**20:.1f} MB; a spec may be at most {limit:g} MB: write a large grid "
                "as axes (grid: {m: [...], n: [...]}), not as a list of points"
            ])  # fmt: skip
        text = path.read_text()
    except OSError as err:
        raise SpecError(source, [f"cannot read the file: {err.strerror}"]) from None
    return loads_spec(text, source, max_trials=max_trials)


def loads_spec(text: str, source: str = "<spec>", *, max_trials: int | None = None) -> SweepSpec:
    try:
        data = load_strict(text)  # libyaml's events; a key given twice is an error
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(source, [f"{where}not valid YAML: {getattr(err, 'problem', err)}"]) from None
    return parse_spec(data, source, max_trials=max_trials)


def dump_spec(spec: SweepSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
