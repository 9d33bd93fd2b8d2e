"""The results store, the farm's lowest layer above its spec: the tables (tables/, one module per
aggregate, the queue's included), opening a store (engine.py) with its one error mapping (errors.py), the
schema version and its Alembic migrations (schema.py, migrations/), and `Store`, the reads and writes
(store.py, made of trial_store, baseline_store, finding_store, draft_store and judging), whose writes take
typed records (records.py, results.py). Everything above imports its names from here."""

from jobs.settings import DEFAULT_DB
from jobs.store.engine import make_engine
from jobs.store.errors import BaselineMoved, store_error
from jobs.store.judging import Judging, baseline_points
from jobs.store.records import (
    AnomalyRecord,
    BaselinePoint,
    DraftRecord,
    DraftRunRecord,
    FailureRecord,
    TrialPoint,
)
from jobs.store.results import TrialResult, result_of
from jobs.store.schema import StoreSchemaError, display_url
from jobs.store.store import Store
from jobs.store.tables import (
    DRAFT_NEW,
    PENDING,
    Anomaly,
    Base,
    Baseline,
    BaselineMove,
    BaselineTrial,
    DraftRow,
    DraftRun,
    Environment,
    Failure,
    Job,
    JobEvent,
    KernelSource,
    OwnerUsage,
    Pool,
    QueuedJob,
    Sample,
    TrialClaim,
    TrialPreemption,
    TrialRow,
    now,
)
from jobs.store.trial_store import status_counts

__all__ = [
    "baseline_points",
    "DEFAULT_DB",
    "DRAFT_NEW",
    "PENDING",
    "Anomaly",
    "AnomalyRecord",
    "Base",
    "Baseline",
    "BaselineMove",
    "BaselinePoint",
    "BaselineTrial",
    "BaselineMoved",
    "DraftRecord",
    "DraftRow",
    "DraftRun",
    "DraftRunRecord",
    "Environment",
    "Failure",
    "FailureRecord",
    "Job",
    "JobEvent",
    "Judging",
    "KernelSource",
    "OwnerUsage",
    "Pool",
    "QueuedJob",
    "Sample",
    "Store",
    "StoreSchemaError",
    "TrialClaim",
    "TrialPreemption",
    "TrialPoint",
    "TrialResult",
    "TrialRow",
    "display_url",
    "make_engine",
    "now",
    "status_counts",
    "result_of",
    "store_error",
]
