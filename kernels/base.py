"""What every kernel family gives the farm, and what one trial returns.

A family is a module `kernels/<name>/case.py` exposing `FAMILY`, an object with:
  name: str
  backends: dict[str, str]            backend name -> one-line description
  shape_keys: tuple[str, ...]         the keys every shape point must have
  def validate(shape, config, dtype, backend) -> None   raise ValueError naming the bad field
  def cost(shape, dtype) -> Cost      FLOPs and bytes moved, for throughput figures
  def run(req: TrialRequest) -> TrialOutcome
Optional, for reports:
  report_metrics: tuple[(metric key, column label, format spec), ...]   extra columns in reports
  scaling: tuple[(shape key, metric key), ...]   plot the metric against that shape key, one line per
                                                 backend/config and value of the other shape keys
The farm (cluster/, jobs/) only ever talks to a family through this surface. Nothing here imports
Ray, a database or HTTP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kernels.measure.policy import MeasurePolicy


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


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


@dataclass
class TrialOutcome:
    # "ok" | "incorrect" | "error", or, for a trial that was deliberately not run and is no failure:
    # "pruned" (the family's resource model says the config cannot run) or "skipped" (the backend is not
    # available on this host, e.g. a library adapter without its library). `error` says why.
    status: str
    samples_ns: list[int] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    timer: str | None = None
    correctness: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def measured(cls, status: str, measurement: Any, **fields: Any) -> TrialOutcome:
        """An outcome carrying a kernels.measure Measurement: raw samples, summary, stop reason, timer."""
        m = measurement.to_dict()
        # The summary also keeps what the report and the anomaly checks read: throttled and kept sample
        # counts, flags (noisy, throttled, step, ...), the clock readings, the warm-up.
        summary = {
            **m["summary"],
            "n_throttled": sum(m["throttled"]),
            "n_kept": sum(m["kept"]),
            # indices into samples_ns of the samples the measurement discarded (taken while throttled):
            # the summary excludes them, and so must any comparison of the raw samples
            "discarded": [i for i, kept in enumerate(m["kept"]) if not kept],
            "flags": m["flags"],
            "clocks": m["clocks"],
            "step": m["step"],
            "warmup_iters": m["warmup_iters"],
            "wall_s": m["wall_s"],
        }
        return cls(
            status=status,
            samples_ns=list(m["samples_ns"]),
            summary=summary,
            stop_reason=m["stop_reason"],
            timer=m["timer"],
            **fields,
        )


class Family(Protocol):
    name: str
    backends: dict[str, str]
    shape_keys: tuple[str, ...]

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None: ...

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost: ...

    def run(self, req: TrialRequest) -> TrialOutcome: ...
