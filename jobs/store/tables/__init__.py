"""The farm store's tables, one module per aggregate: a job with its trials, samples and environments
(trials.py), the named baselines (baselines.py), what an acceptance run found (findings.py: anomalies and
the failure bank), the drafts of the agent acceptance layer (drafts.py) and the queue's rows (queue.py).
All of them are declared on one `Base` (base.py), whose metadata the migrations and the schema check read:
importing this package registers every table."""

from jobs.store.tables.base import PENDING, Base, now
from jobs.store.tables.baselines import Baseline, BaselineMove, BaselineTrial
from jobs.store.tables.drafts import DRAFT_NEW, DraftRow, DraftRun
from jobs.store.tables.findings import Anomaly, Comparison, Failure
from jobs.store.tables.queue import (
    JobEvent,
    KernelSource,
    OwnerUsage,
    Pool,
    QueuedJob,
    TrialClaim,
    TrialPreemption,
)
from jobs.store.tables.trials import Environment, Job, Sample, TrialRow

__all__ = [
    "DRAFT_NEW",
    "PENDING",
    "Anomaly",
    "Base",
    "Baseline",
    "BaselineMove",
    "BaselineTrial",
    "Comparison",
    "DraftRow",
    "DraftRun",
    "Environment",
    "Failure",
    "Job",
    "JobEvent",
    "KernelSource",
    "OwnerUsage",
    "Pool",
    "QueuedJob",
    "Sample",
    "TrialClaim",
    "TrialPreemption",
    "TrialRow",
    "now",
]
