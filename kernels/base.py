"""The contract between kernel families and the farm: what one trial asks for and what it returns.

A family is a module `kernels/<name>/case.py` exposing `FAMILY`, a `KernelFamily` with:
  name: str
  backends: Backends                  each backend declared where it is defined, with its availability
                                      (and the reason when unavailable), whether it is the reference,
                                      and its config space (see `Backends.register`)
  shape_keys: tuple[str, ...]         the keys every shape point must have
  def validate(shape, config, dtype, backend) -> None   raise ValueError naming the bad field
  def cost(shape, dtype) -> Cost      FLOPs and bytes read and written by one call
  def execute(req: TrialRequest) -> TrialOutcome       run one trial of an available backend: a kernel
                                      trial hands kernels.harness.run_trial a builder of one seed's
                                      Prepared (timed call, check against the reference, Cost); the
                                      harness checks every seed, times, and derives the rates
Declared with defaults (none), for reports and exports:
  optional_shape_keys: tuple[str, ...]           keys a shape point may add to shape_keys
  def canonical_shape(shape) -> shape            the point as the farm stores it (a spec's point goes
                                                 through it): a family drops an optional key written
                                                 at its default, so the point is one series either way
  report_metrics: tuple[Metric(key, label, format spec), ...]   extra columns in reports
  scaling: tuple[(shape key, metric key), ...]   plot the metric against that shape key, one line per
                                                 backend/config and value of the other shape keys
  def best_configs(trials, backend) / best_configs_file(key, device)   the family's tuned-config export
                                                 (`farm export best-configs`; fp8_gemm has one)
The farm calls `FAMILY.run(req)`, which answers `skipped` with the reason for a backend that cannot run
on this host and calls `execute` otherwise. A family declares its work as a `Cost`; `derive_rates`
turns a Cost and a median time into TFLOPS, GB/s and the fraction of the hardware roofline, the one
place those are computed. tests/kernels/test_contract.py holds every registered family to this.
Nothing here imports Ray, a database or HTTP.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from kernels.hardware import DeviceLimits, triton_interpreting
from kernels.measure.policy import MeasurePolicy

if TYPE_CHECKING:
    from kernels.measure.timing import Measurement


class TrialStatus(StrEnum):
    """The only list of trial statuses. Members are strings, so stored values stay the plain words."""

    PENDING = "pending"  # created with the job, not run yet (or to be retried)
    OK = "ok"  # ran and passed its correctness check
    INCORRECT = "incorrect"  # ran, and its output failed the correctness check
    ERROR = "error"  # the kernel code (or the framework around it) raised
    TIMEOUT = "timeout"  # ran past the spec's timeout_s; its worker was killed
    CRASHED = "crashed"  # its worker died on every attempt
    PRUNED = "pruned"  # not run: the family's resource model says the config cannot run
    SKIPPED = "skipped"  # not run: the backend is unavailable on this host (the error says why)
    # ran and passed, but its measurement cannot be true (kernels.validity: faster than the hardware
    # allows, an output that does not follow its inputs); never compared, never a baseline; error says why
    INVALID = "invalid"

    @property
    def finished(self) -> bool:
        """Finished trials are never run again by `farm sweep resume`."""
        return self is not TrialStatus.PENDING

    @property
    def failed(self) -> bool:
        """A finished trial that makes the job fail (exit code 1)."""
        return self.finished and self not in (TrialStatus.OK, TrialStatus.PRUNED, TrialStatus.SKIPPED)

    @property
    def not_run(self) -> bool:
        """Finished without running, by design: no failure, nothing measured."""
        return self in (TrialStatus.PRUNED, TrialStatus.SKIPPED)

    @property
    def measured(self) -> bool:
        """Ran to the end: it has a correctness verdict and (normally) timings."""
        return self in (TrialStatus.OK, TrialStatus.INCORRECT)

    @classmethod
    def passed(cls, ok: bool) -> TrialStatus:
        return cls.OK if ok else cls.INCORRECT


FINISHED: tuple[TrialStatus, ...] = tuple(s for s in TrialStatus if s.finished)
NOT_FAILED: tuple[TrialStatus, ...] = tuple(s for s in FINISHED if not s.failed)


# ---- cost and the rates derived from it ---------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """The work one call of a kernel does: what the farm derives every rate from."""

    flops: float
    bytes_read: float
    bytes_written: float
    # the bytes HBM must move when they are not bytes_read + bytes_written (data several programs read
    # but stored once, scratch written and read back): the roofline and the HBM fraction use it; GB/s keeps
    # `bytes`, the family's published convention. None: the same as `bytes`.
    hbm_bytes_moved: float | None = field(default=None, kw_only=True)

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def hbm_bytes(self) -> float:
        return self.bytes if self.hbm_bytes_moved is None else self.hbm_bytes_moved


@dataclass(frozen=True)
class Rates:
    """What a Cost and a median time give. The roofline fields are None off a GPU of known limits."""

    # None: no positive median to divide by (an undefined rate, never NaN)
    seconds: float | None
    tflops: float | None
    gbps: float | None  # Cost.bytes per second (the family's convention)
    roofline_s: float | None = None  # the least time the hardware's bandwidth and peak FLOPS allow
    roofline_fraction: float | None = None  # roofline_s / seconds: 1.0 is at the roofline
    bandwidth_fraction: float | None = None  # HBM bytes moved per second over the HBM bandwidth
    hbm_gbps: float | None = None  # Cost.hbm_bytes per second, where those differ from Cost.bytes


def derive_rates(
    cost: Cost, median_ns: float, limits: DeviceLimits | None = None, precision: str = "bf16"
) -> Rates:
    """TFLOPS, GB/s and, given the device's limits, the roofline fractions of one call of `median_ns`
    (the roofline and the HBM fraction on the bytes HBM moves, Cost.hbm_bytes). A median that is not a
    positive number gives undefined (None) rates: nothing to divide by."""
    seconds = median_ns / 1e9 if median_ns is not None else math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        return Rates(seconds=None, tflops=None, gbps=None)
    hbm_gbps = cost.hbm_bytes / seconds / 1e9
    rates = Rates(
        seconds=seconds,
        tflops=cost.flops / seconds / 1e12,
        gbps=cost.bytes / seconds / 1e9,
        hbm_gbps=hbm_gbps if cost.hbm_bytes != cost.bytes else None,
    )
    if limits is None:
        return rates
    peak = limits.dense_tflops.get(precision, limits.dense_tflops["bf16"])
    roof = max(cost.hbm_bytes / (limits.hbm_gbps * 1e9), cost.flops / (peak * 1e12))
    return dataclasses.replace(
        rates,
        roofline_s=roof,
        roofline_fraction=roof / seconds,
        bandwidth_fraction=hbm_gbps / limits.hbm_gbps,
    )


# ---- backends -----------------------------------------------------------------------------------


def always_available() -> str | None:
    return None


def needs_triton() -> str | None:
    """Why Triton kernels cannot run here, or None: a GPU, or the CPU interpreter (TRITON_INTERPRET)."""
    if importlib.util.find_spec("triton") is None:
        return "triton: the triton package is not installed"
    import torch

    if not torch.cuda.is_available() and not triton_interpreting():
        return "triton: no GPU and TRITON_INTERPRET is not set"
    return None


@dataclass(frozen=True)
class Backend:
    """One backend of a family, declared where it is defined."""

    name: str
    description: str
    reference: bool = False  # the family's reference: what other backends are checked against
    config_keys: tuple[str, ...] = ()  # the config space: the keys a trial's config may carry
    requires: Callable[[], str | None] = always_available  # why it cannot run here, or None
    impl: Callable[..., Any] | None = None  # the family's own hook for this backend (what it runs)
    # extra checks of a trial's (shape, config) for this backend: raise ValueError naming the field
    check: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    # why this backend cannot run a (valid) shape, or None: such a trial is skipped with the reason, not
    # refused, since the shape is fine for the family's other backends
    skips: Callable[[Mapping[str, Any]], str | None] | None = None
    # config keys that pick a variant of the code that runs, not the point measured (a plugin's injected
    # fault, a build option): baselines, anomaly fingerprints and history pair trials across them
    variant_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:  # keys given as any sequence are kept as tuples
        object.__setattr__(self, "config_keys", tuple(self.config_keys))
        object.__setattr__(self, "variant_keys", tuple(self.variant_keys))

    def unavailable_reason(self, shape: Mapping[str, Any] | None = None) -> str | None:
        reason = self.requires()
        if reason is None and shape is not None and self.skips is not None:
            reason = self.skips(shape)
        return reason

    @property
    def runs_triton(self) -> bool:
        """It runs a Triton kernel of ours (declared by requiring Triton): the one kernels.compiled
        compiles and checks."""
        return self.requires is needs_triton


class Backends(Mapping[str, Backend]):
    """A family's backends by name. Declare each with `add` or, on the function that implements it,
    with the `register` decorator; a family has exactly one reference backend."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._by_name: dict[str, Backend] = {}

    def add(self, name: str, description: str, **declared: Any) -> Backend:
        """Declare backend `name`; the keywords are Backend's fields (reference, config_keys, requires,
        impl, check, skips, variant_keys)."""
        if name in self._by_name:
            raise ValueError(f"{self.family}: backend {name!r} is declared twice")
        if declared.get("reference") and any(b.reference for b in self._by_name.values()):
            raise ValueError(f"{self.family}: a second reference backend {name!r}")
        backend = Backend(name, description, **declared)
        self._by_name[name] = backend
        return backend

    def register(
        self, name: str, description: str, **declared: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare the decorated function as the implementation of backend `name` (`add`'s keywords)."""

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(name, description, impl=fn, **declared)
            return fn

        return decorate

    def wrap(
        self,
        name: str,
        wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
        *,
        config_keys: tuple[str, ...] = (),
        variant_keys: tuple[str, ...] = (),
        check: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    ) -> Backend:
        """Put `wrapper(impl)` in place of backend `name`'s implementation, taking `config_keys` more (those
        also in `variant_keys` are not part of the point) checked by `check` after the backend's own: the
        extension point of a FARM_PLUGINS module (kernels.registry) that changes how a backend runs."""
        old = self[name]

        def checks(shape: dict[str, Any], config: dict[str, Any]) -> None:
            for each in (old.check, check):
                if each is not None:
                    each(shape, config)

        new = dataclasses.replace(
            old,
            impl=wrapper(self.impl(name)),
            config_keys=old.config_keys + tuple(config_keys),
            variant_keys=old.variant_keys + tuple(variant_keys),
            check=checks,
        )
        self._by_name[name] = new
        return new

    @property
    def reference(self) -> Backend:
        found = [b for b in self._by_name.values() if b.reference]
        if len(found) != 1:
            raise LookupError(f"{self.family}: {len(found)} reference backends declared (want one)")
        return found[0]

    def impl(self, name: str) -> Callable[..., Any]:
        fn = self[name].impl
        if fn is None:
            raise LookupError(f"{self.family}: backend {name!r} has no implementation registered")
        return fn

    def __getitem__(self, name: str) -> Backend:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name)
            raise KeyError(f"unknown {self.family} backend {name!r} (known: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


# ---- what crosses the Ray boundary --------------------------------------------------------------


@dataclass(frozen=True)
class TrialRequest:
    family: str
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    dtype: str
    policy: MeasurePolicy = field(default_factory=MeasurePolicy)
    seeds: int = 2
    device: str = "cpu"


def throttle_count(record: Mapping[str, Any]) -> int | None:
    """How many samples ran throttled, as a record holds it: a count or a list of per-sample flags under
    `n_throttled`, `throttled_samples` or `throttled`; None when it holds none."""
    for key in ("n_throttled", "throttled_samples", "throttled"):
        value = record.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, list):
            return sum(1 for v in value if v)
    return None


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class Summary:
    """A trial's measurement as stored: statistics over the kept samples (ns; cv a fraction; None where
    not finite) and what the report and the anomaly checks read about how it was taken."""

    n: int
    median: float | None
    mean: float | None
    min: float | None
    max: float | None
    p10: float | None
    p90: float | None
    iqr: float | None
    mad: float | None
    stdev: float | None
    cv: float | None
    n_throttled: int = 0
    n_kept: int = 0
    # indices into samples_ns of the samples the measurement discarded (taken while throttled): the
    # statistics exclude them, and so must any comparison of the raw samples
    discarded: tuple[int, ...] = ()
    flags: tuple[str, ...] = ()  # noisy, throttled, step, few_samples
    clocks: dict[str, Any] = field(default_factory=dict)
    step: dict[str, Any] | None = None
    warmup_iters: int = 0
    wall_s: float = 0.0

    @classmethod
    def of(cls, m: Measurement) -> Summary:
        s = m.summary
        return cls(
            n=s.n,
            median=_finite_or_none(s.median),
            mean=_finite_or_none(s.mean),
            min=_finite_or_none(s.min),
            max=_finite_or_none(s.max),
            p10=_finite_or_none(s.p10),
            p90=_finite_or_none(s.p90),
            iqr=_finite_or_none(s.iqr),
            mad=_finite_or_none(s.mad),
            stdev=_finite_or_none(s.stdev) if s.n > 1 else None,  # one sample has no spread
            cv=_finite_or_none(s.cv) if s.n > 1 else None,
            n_throttled=sum(bool(t) for t in m.throttled),
            n_kept=sum(bool(k) for k in m.kept),
            discarded=tuple(i for i, kept in enumerate(m.kept) if not kept),
            flags=tuple(m.flags),
            clocks=m.clocks,
            step=m.step,
            warmup_iters=m.warmup_iters,
            wall_s=m.wall_s,
        )

    @classmethod
    def from_samples(cls, samples_ns: Sequence[float]) -> Summary:
        """The statistics of samples taken outside a measurement (imported timings, tests): every sample
        kept, no flags."""
        from kernels.measure.summary import summarize

        s = summarize(samples_ns)
        stats = {k: _finite_or_none(getattr(s, k)) for k in ("median", "mean", "min", "max", "p10", "p90")}
        spread = {k: _finite_or_none(getattr(s, k)) for k in ("iqr", "mad", "stdev", "cv")}
        if s.n < 2:  # one sample has no spread
            spread.update(stdev=None, cv=None)
        return cls(n=s.n, n_kept=s.n, **stats, **spread)

    def to_dict(self) -> dict[str, Any]:
        """The JSON the store keeps (lists where the dataclass has tuples)."""
        d = asdict(self)
        d["discarded"], d["flags"] = list(self.discarded), list(self.flags)
        return d

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> Summary:
        """A summary as the store keeps it (`to_dict`'s JSON) read back typed: no result yet (None) is an
        empty one (n 0, every statistic None), and a value of the wrong type, or not finite, reads as
        absent, so no reader meets a NaN, a string or a missing key."""
        d = data if isinstance(data, Mapping) else {}

        def num(key: str) -> float | None:
            v = d.get(key)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            return float(v) if ok else None

        def count(key: str) -> int:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

        def listed(key: str, kind: type) -> tuple:
            """A list's items of `kind` (a string or a mapping in its place: none, not its characters)."""
            v = d.get(key)
            return tuple(i for i in v if isinstance(i, kind)) if isinstance(v, list | tuple) else ()

        clocks, step = d.get("clocks"), d.get("step")
        throttled = throttle_count(d) or 0
        return cls(
            n=count("n"), median=num("median"), mean=num("mean"), min=num("min"), max=num("max"),
            p10=num("p10"), p90=num("p90"), iqr=num("iqr"), mad=num("mad"), stdev=num("stdev"), cv=num("cv"),
            n_throttled=throttled, n_kept=count("n_kept"),
            discarded=listed("discarded", int), flags=listed("flags", str),
            clocks=dict(clocks) if isinstance(clocks, Mapping) else {},
            step=dict(step) if isinstance(step, Mapping) else None,
            warmup_iters=count("warmup_iters"), wall_s=num("wall_s") or 0.0,
        )  # fmt: skip


@dataclass
class TrialOutcome:
    """What a family returns for one trial. `error` says why for error, pruned and skipped."""

    status: TrialStatus
    samples_ns: list[int] = field(default_factory=list)
    summary: Summary | None = None
    stop_reason: str | None = None
    timer: str | None = None
    correctness: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)

    @classmethod
    def measured(cls, status: TrialStatus | str, measurement: Measurement, **fields: Any) -> TrialOutcome:
        """An outcome carrying a kernels.measure Measurement: raw samples, summary, stop reason, timer."""
        return cls(
            status=TrialStatus(status),
            samples_ns=[int(v) for v in measurement.samples_ns],
            summary=Summary.of(measurement),
            stop_reason=measurement.stop_reason,
            timer=measurement.timer,
            **fields,
        )

    @property
    def median_ns(self) -> float | None:
        return self.summary.median if self.summary is not None else None

    def stored_fields(self) -> dict[str, Any]:
        """The outcome as the results store's columns (plus `samples_ns`, stored as sample rows)."""
        return {
            "status": self.status,
            "error": self.error,
            "summary": self.summary.to_dict() if self.summary is not None else None,  # nothing measured
            "stop_reason": self.stop_reason,
            "timer": self.timer,
            "correctness": self.correctness,
            "correct": self.correctness.get("passed"),
            "metrics": self.metrics,
            "memory": self.memory,
            "resources": self.resources,
            "samples_ns": self.samples_ns,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = str(self.status)
        d["summary"] = self.summary.to_dict() if self.summary is not None else {}
        return d


# ---- the family ---------------------------------------------------------------------------------


class Metric(NamedTuple):
    """An extra metric a family declares for reports (KernelFamily.report_metrics): its key in a trial's
    metrics, the column's label and the format spec of its value."""

    key: str
    label: str
    fmt: str = ""


class KernelFamily:
    """Base of every family: `run` answers unavailable backends, `execute` (the family's) does the rest."""

    name: str
    backends: Backends
    shape_keys: tuple[str, ...]
    optional_shape_keys: tuple[str, ...] = ()
    report_metrics: tuple[Metric, ...] = ()
    scaling: tuple[tuple[str, str], ...] = ()

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        raise NotImplementedError

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        raise NotImplementedError

    def canonical_shape(self, shape: dict[str, Any]) -> dict[str, Any]:
        """The shape point as stored and identified (jobs.spec.sweep applies it to every point): the
        same point unless the family writes some keys one way only."""
        return shape

    def execute(self, req: TrialRequest) -> TrialOutcome:
        raise NotImplementedError

    def point_config(self, backend: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config as the point measured: without the backend's variant keys (Backend.variant_keys)."""
        variants = self.backends[backend].variant_keys if backend in self.backends else ()
        return {k: v for k, v in config.items() if k not in variants}

    def meta_launch(
        self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str
    ) -> Callable[[], Any] | None:
        """The trial's Triton launches on meta tensors (for kernels.compiled), or None when the backend
        runs no Triton kernel of ours."""
        return None

    def best_configs(self, trials: Any, backend: str) -> tuple[dict[str, Any], list[str]]:
        """The fastest correct config of `backend` per shape, and the shapes without one (`farm export
        best-configs`): {"m=64,n=256,k=256": {"config": {...}, "median_ns": ...}}. A family whose users key
        tuned configs their own way overrides it (fp8_gemm: as Triton ports do)."""
        best, missing = fastest_correct(trials, backend, lambda shape: tuple(shape.items()))

        def label(key: tuple) -> str:
            return ",".join(f"{k}={v}" for k, v in key)

        table = {label(k): {"config": t.config, "median_ns": t.median_ns} for k, t in best.items()}
        return table, [label(k) for k in missing]

    def best_configs_file(self, key: str, device_name: str) -> str:
        """The file one entry of `best_configs` goes to (`--split-dir`)."""
        return f"{key},device_name={device_name.replace(' ', '_')}.json"

    def unavailable(self, req: TrialRequest, reason: str) -> TrialOutcome:
        """The outcome of a trial whose backend cannot run here; a family may add what it knows."""
        return TrialOutcome(status=TrialStatus.SKIPPED, error=reason)

    def run(self, req: TrialRequest) -> TrialOutcome:
        reason = self.backends[req.backend].unavailable_reason(req.shape)
        if reason is not None:
            return self.unavailable(req, reason)
        return self.execute(req)


# The structural type the farm relies on (KernelFamily satisfies it).
Family = KernelFamily


def trial_label(
    backend: str, shape: Mapping[str, Any], config: Mapping[str, Any], dtype: str, seq: int | None = None
) -> str:
    """The one human label of a trial: `backend[m128xn64 block_m=64 float32]`, with `#seq ` in front
    for a stored trial (its position in the job's grid)."""
    shape_part = "x".join(f"{k}{v}" for k, v in shape.items())
    config_part = ",".join(f"{k}={v}" for k, v in config.items())
    label = f"{backend}[{shape_part}{' ' + config_part if config_part else ''} {dtype}]"
    return label if seq is None else f"#{seq} {label}"


def fastest_correct(
    trials: Iterable[Any], backend: str, key: Callable[[dict[str, Any]], Any]
) -> tuple[dict[Any, Any], list[Any]]:
    """The fastest ok and correct trial of `backend` per `key(shape)` (in key order), and the keys whose
    trials of that backend have none: what every best-configs export selects from."""
    best: dict[Any, Any] = {}
    keys: set[Any] = set()
    for t in trials:
        if t.backend != backend:
            continue
        k = key(t.shape)
        keys.add(k)
        if t.status == TrialStatus.OK and t.correct and t.median_ns is not None:
            if k not in best or t.median_ns < best[k].median_ns:
                best[k] = t
    return {k: best[k] for k in sorted(best)}, sorted(keys - set(best))
