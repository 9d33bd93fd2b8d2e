"""What the store's writes take: one typed record per kind of row a caller hands it (never a dict), and
`columns`, the one place a record becomes a row's values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol


class TrialPoint(Protocol):
    """A grid point a new job gets a pending trial row for (jobs.spec.sweep.TrialSpec, or the rows of a
    confirmation job, jobs.judge.confirm)."""

    @property
    def key(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def baseline(self) -> bool: ...
    @property
    def shape(self) -> Mapping[str, Any]: ...
    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def dtype(self) -> str: ...


@dataclass(frozen=True)
class BaselinePoint:
    """One point of a baseline: the trial a later trial with the same match key is compared to."""

    match_key: str
    env_class: str
    trial_id: int


@dataclass(frozen=True)
class AnomalyRecord:
    """One anomaly of an analysis of a job (jobs.judge.anomalies names the kinds)."""

    trial_id: int | None
    kind: str
    severity: str
    fingerprint: str
    message: str
    evidence: dict[str, Any]
    baseline_trial_id: int | None = None


@dataclass(frozen=True)
class FailureRecord:
    """One failed (or ambiguous-as-failed) card assertion of an acceptance run: the failure bank."""

    trial_id: int | None
    card: str
    assertion: str
    outcome: str
    fingerprint: str
    label: str
    message: str
    evidence: dict[str, Any]
    git_commit: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class DraftRunRecord:
    """One drafting of a job's anomalies: what was sent, to which model, what it cost."""

    task: str
    anomalies: int
    sent: int
    raw_bytes: int
    compressed_bytes: int
    model: str | None = None
    provider: str | None = None
    offline: bool = False
    cached: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    batch: dict[str, Any] | None = None


@dataclass(frozen=True)
class DraftRecord:
    """One draft of a drafting, as the model (or the offline drafter) returned it, its check validated."""

    assertion: str
    verify_how: str
    failure_signature: str
    needs_local_profiler: bool
    fingerprints: list[str]
    contents: dict[str, str] | None = None
    offline: bool = False
    check_spec: dict[str, Any] | None = None
    check_error: str | None = None


def columns(record: Any, **more: Any) -> dict[str, Any]:
    """A record's fields as a row's column values (nested values are not copied), with `more` added."""
    return {f.name: getattr(record, f.name) for f in fields(record)} | more
