"""`Store`: every read and write of the farm's results, one object per process, cheap to construct.

Its methods come by aggregate from trial_store (jobs, trials, samples, environments), baseline_store,
finding_store (anomalies, the failure bank), draft_store, judging (the one read a verdict makes) and
retention (old samples pruned) and page_reads (what `farm site` rebuilds); this module opens the
engine they share (jobs.store.engine)."""

from __future__ import annotations

from jobs.settings import DEFAULT_DB
from jobs.store.baseline_store import BaselineStore
from jobs.store.draft_store import DraftStore
from jobs.store.engine import make_engine
from jobs.store.finding_store import FindingStore
from jobs.store.judging import JudgingStore
from jobs.store.page_reads import PageReads
from jobs.store.retention import RetentionStore
from jobs.store.trial_store import TrialStore


class Store(TrialStore, BaselineStore, FindingStore, DraftStore, JudgingStore, RetentionStore, PageReads):
    """All reads and writes of the farm's results. One per process; cheap to construct."""

    def __init__(self, url: str | None = None, *, create: bool = True, source: str | None = None):
        """`create=False`: open an existing store only (make_engine); the commands that only read."""
        self.url = url or DEFAULT_DB
        self.engine = make_engine(url, create=create, source=source)
        self._env_ids: dict[str, int] = {}

    def close(self) -> None:
        self.engine.dispose()
