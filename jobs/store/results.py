"""A finished trial as the store writes it: the worker's typed outcome and where it ran.

`Store.record_results` takes `TrialResult`s, never dicts: the outcome stays a kernels.base.TrialOutcome
(its Summary typed) from the worker to the row; `columns()` is the one place it becomes the row's values.
A trial that ended without a measurement (a timeout, a worker that died on every attempt) is a
`TrialResult.ended(...)` with its status and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kernels.base import Summary, TrialOutcome, TrialStatus


@dataclass(frozen=True)
class TrialResult:
    trial_id: int
    outcome: TrialOutcome
    attempt: int = 1
    node: str | None = None
    worker: str | None = None
    gpu_id: int | None = None
    gpu_type: str | None = None  # the accelerator type of the node it ran on (None: not declared)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    environment: Mapping[str, Any] | None = None  # what the worker reported of its host (deduplicated)

    @classmethod
    def ended(cls, trial_id: int, status: TrialStatus | str, error: str, **where: Any) -> TrialResult:
        """A trial that finished without a measurement (timeout, crashed): its status and why."""
        return cls(trial_id, TrialOutcome(status=TrialStatus(status), error=error), **where)

    @property
    def status(self) -> TrialStatus:
        return self.outcome.status

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, TrialOutcome):
            raise TypeError(
                f"trial {self.trial_id}: outcome must be a TrialOutcome, not {type(self.outcome)}"
            )

    def columns(self) -> dict[str, Any]:
        """The trial row's values (the samples go to their own table: `samples_ns`)."""
        fields = self.outcome.stored_fields()
        fields.pop("samples_ns")
        return {
            **fields,
            "attempt": self.attempt,
            "node": self.node,
            "worker": self.worker,
            "gpu_id": self.gpu_id,
            "gpu_type": self.gpu_type,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "median_ns": self.outcome.median_ns,
        }

    @property
    def samples_ns(self) -> list[int]:
        return self.outcome.samples_ns


def result_of(
    trial_id: int,
    samples_ns: Sequence[int] = (),
    *,
    status: TrialStatus | str = TrialStatus.OK,
    summary: Summary | None = None,
    correct: bool | None = None,
    environment: Mapping[str, Any] | None = None,
    attempt: int = 1,
    node: str | None = None,
    worker: str | None = None,
    finished_at: datetime | None = None,
    **outcome: Any,
) -> TrialResult:
    """A result made outside a worker (tests, benchmarks, imported timings): the summary is the samples'
    own (kernels.measure.summary) unless one is given; `correct` stands for a correctness record of
    just its verdict; other keywords are TrialOutcome fields (metrics, correctness, error, ...)."""
    if summary is None and samples_ns:
        summary = Summary.from_samples(samples_ns)
    if correct is not None:
        outcome.setdefault("correctness", {"passed": correct})
    out = TrialOutcome(
        status=TrialStatus(status), samples_ns=[int(v) for v in samples_ns], summary=summary, **outcome
    )
    return TrialResult(trial_id, out, attempt, node, worker, finished_at=finished_at, environment=environment)
