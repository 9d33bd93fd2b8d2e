"""The contract of the summaries endpoint: its path, and its fixed formats, compressed anomalies in and
drafts out (pydantic).

The farm sends only these fields (never raw logs or code); the model answers only drafts. This module is
the one both sides import: the gateway (gateway.summaries.batcher, the batcher; gateway.summaries.offline, the
offline drafter) and the farm, its client (jobs.drafts.client). So it depends on pydantic alone and never on
the gateway's server code (tests/jobs/test_drafts.py checks what importing the farm's client loads).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The endpoint, from the gateway's root URL (a client whose base URL ends in /v1 strips it first).
SUMMARIES_PATH = "/v1/farm/summaries"

Task = Literal["checklist", "log_summary"]
MAX_DIFF_DEPTH = 16  # levels of nesting in an anomaly's config_diff
TASKS: tuple[str, ...] = ("checklist", "log_summary")
Scalar = str | int | float | bool | None


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Interface(_In):
    family: str = Field(min_length=1, max_length=64)
    backend: str = Field(min_length=1, max_length=64)
    signature: str = Field("", max_length=1000)
    shape: dict[str, Scalar] = Field(default_factory=dict, max_length=32)  # the point, for a check's scope
    dtype: str = Field("", max_length=64)


class ExpectedMetric(_In):
    """A card threshold next to the measured value, e.g. ratio <= 1.05, measured 1.31."""

    metric: str = Field(min_length=1, max_length=100)
    expected: str = Field(max_length=200)  # "<= 1.05", ">= 50% of HBM", "pass"
    measured: Scalar = None


class AnomalyIn(_In):
    """One compressed anomaly. ``id`` is the caller's own label; drafts name it back."""

    id: str = Field(min_length=1, max_length=64)
    fingerprint: str = Field(min_length=1, max_length=64)
    kind: str = Field(min_length=1, max_length=32)
    severity: str = Field("error", max_length=16)
    message: str = Field("", max_length=2000)
    interface: Interface
    config_diff: dict[str, Any] = Field(default_factory=dict)
    log_excerpt: str = Field("", max_length=16_384)
    expected_metrics: list[ExpectedMetric] = Field(default_factory=list, max_length=64)
    prohibitions: list[str] = Field(default_factory=list, max_length=16)
    device: Literal["", "cpu", "gpu"] = ""  # what timed it: CPU timings are noisier and have no SM clock

    @field_validator("config_diff")
    @classmethod
    def _shallow(cls, v: dict[str, Any]) -> dict[str, Any]:
        """A config diff is a few keys of scalars or short lists: nesting past MAX_DIFF_DEPTH is refused
        here (pydantic's serializer gives up near 255 levels, and nothing reads that deep anyway)."""
        stack: list[tuple[Any, int]] = [(v, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DIFF_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DIFF_DEPTH} levels")
            children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
        return v

    def content_hash(self) -> str:
        """What the anomaly says, without the caller's label: equal content, equal hash."""
        body = self.model_dump(mode="json", exclude={"id"})
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class SummaryRequest(_In):
    task: Task
    model: str | None = Field(None, min_length=1)
    anomalies: list[AnomalyIn] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> SummaryRequest:
        seen: set[str] = set()
        for i, a in enumerate(self.anomalies):
            if a.id in seen:
                raise ValueError(f"anomalies.{i}.id: {a.id!r} is used twice")
            seen.add(a.id)
        return self


# A draft's check, in the metric card's grammar (jobs/spec/cards.py: CardCheck, CHECK_METRICS): the farm
# validates it against the card schema; here it is only named, so a model's bad check never costs a draft
# its prose (the farm keeps the prose and records why the check does not validate).
CHECK_METRICS: tuple[str, ...] = (
    "cv", "median_ns", "ratio", "correct", "completes", "max_abs_err", "max_rel_err", "bytes_per_token",
    "peak_bytes", "n_spills", "occupancy", "tflops", "gbps",
)  # fmt: skip
CHECK_OPS: tuple[str, ...] = ("<=", "<", ">=", ">", "==")


class CheckScope(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: str | None = None
    backend: str | None = None
    shapes: list[dict[str, Scalar]] | None = None
    dtype: str | None = None


class DraftCheck(BaseModel):
    """`metric op threshold` on the trials in `scope`: what the offline drafter writes."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    op: str
    threshold: float
    scope: CheckScope = Field(default_factory=CheckScope)


class Draft(BaseModel):
    """One draft a kernel engineer edits. Extra keys from a model are ignored; ``check`` is kept as the
    model wrote it (a mapping, else None) for the farm to validate against the card schema."""

    model_config = ConfigDict(extra="ignore")
    assertion: str = Field(min_length=1, max_length=2000)
    verify_how: str = Field(min_length=1, max_length=2000)
    failure_signature: str = Field(min_length=1, max_length=1000)
    needs_local_profiler: bool
    anomaly_ids: list[str] = Field(min_length=1)
    check: dict[str, Any] | None = None

    @field_validator("check", mode="before")
    @classmethod
    def _mapping_or_none(cls, v: Any) -> Any:
        if v is None or isinstance(v, dict):
            return v
        return {"_invalid": str(v)[:200]}  # not a mapping: kept for the farm to say why it is refused


class DraftList(BaseModel):
    model_config = ConfigDict(extra="ignore")
    drafts: list[Draft]


# --- the usage of a caller's own model calls: ``POST USAGE_PATH`` (gateway.http.endpoints.usage) ---------
# The farm's token account (jobs.drafts.account) sends the request ids its draft runs keep (the summaries
# reply's ``batch.request_ids``) with its project key, and gets back the ledger rows of those ids that belong
# to that key's project; any other id (another project's, or not in the ledger yet) is listed in `unknown`,
# never described.
USAGE_PATH = "/v1/usage/requests"
MAX_USAGE_IDS = 1000  # request ids in one request; a client with more sends several requests


class UsageRequest(_In):
    request_ids: list[str] = Field(max_length=MAX_USAGE_IDS)

    @field_validator("request_ids")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        for i, rid in enumerate(v):
            if not rid or len(rid) > 64:
                raise ValueError(f"request_ids.{i}: a request id is 1 to 64 characters")
        return v


class RequestUsage(BaseModel):
    """One ledger row, as the token account reads it."""

    model_config = ConfigDict(extra="ignore")
    request_id: str
    date: str  # the UTC day of the request, YYYY-MM-DD
    ts: str  # ISO 8601, UTC
    project: str
    key_id: str | None = None
    endpoint: str
    task: str | None = None
    session_id: str | None = None  # the agent session (Claude Code's, or the ``session-id`` header)
    model: str | None = None  # the public model asked for
    upstream_model: str | None = None
    provider: str | None = None
    status: str
    http_status: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    tokens_estimated: bool = False
    cost_usd: float | None = None  # None: the model has no price
    retries: int = 0
    rate_limited: int = 0  # upstream 429 answers met (retried, or the last one)
    retry_wait_ms: float = 0.0  # time waited between upstream attempts
    max_tokens: int | None = None  # the output cap asked for (None: none, or a row from before it was kept)
    batch_size: int | None = None  # summaries: anomalies the call carried


class UsageReply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    project: str
    rows: list[RequestUsage]
    unknown: list[str]  # asked for, not found among the caller's project's rows
