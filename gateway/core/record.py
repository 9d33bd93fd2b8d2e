"""What one request did: the ``Record`` the request path fills in, and the ``LedgerRow`` it becomes.

A ``Record`` is made for every client request (and for every model call the summaries batcher makes); the
request path (gateway.http.pipeline) turns it into exactly one ``LedgerRow`` and one set of metrics. The
row's keys are the ledger table's columns (gateway.store.db.ledger; a test checks they agree), so the
ledger writer (gateway.store.ledger) and its spool take a row as it is built here.
"""

from __future__ import annotations

import itertools
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple, TypedDict

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import ProjectConfig
    from gateway.core.usage import Usage

# Request ids: a random prefix drawn once per process, then a counter (unique without a syscall each).
_ID_PREFIX = os.urandom(6).hex()
_ID_SEQ = itertools.count(int.from_bytes(os.urandom(3), "big") << 16)


# The gateway's own time on an answer, in milliseconds (gateway/README.md "The gateway's own time")
OVERHEAD_HEADER = "x-farm-overhead-ms"


def own_time(elapsed: float, upstream_s: float | None, queue_wait: float) -> float:
    """The gateway's own time in ``elapsed`` seconds: less the upstream's time and the queue wait. The one
    computation behind the ``x-farm-overhead-ms`` header and the ``gateway_overhead_seconds`` histogram."""
    return max(0.0, elapsed - (upstream_s or 0.0) - queue_wait)


class LedgerRow(TypedDict):
    """One row of the token ledger (the columns of gateway.store.db.ledger)."""

    request_id: str
    ts: datetime
    endpoint: str
    upstream_request_id: str | None
    project: str | None
    key_id: str | None
    public_model: str | None
    upstream_model: str | None
    provider: str | None
    task: str | None
    session_id: str | None
    stream: bool
    status: str  # ok | error | rejected | cancelled
    http_status: int | None
    error_class: str | None
    retries: int
    input_tokens: int
    output_tokens: int
    tokens_estimated: bool
    cached_input_tokens: int
    cache_write_tokens: int
    latency_ms: float
    upstream_ms: float | None
    ttft_ms: float | None
    queue_wait_ms: float
    batch_size: int | None
    deployment: str | None
    fallback_from: str | None
    translation: str | None
    cost_usd: float | None
    shared_pending: bool | None  # True: Redis may lack its usage (gateway.limits.redis)
    dropped_fields: str | None  # request fields translation left out, comma-separated (translate.policy)
    rate_limited: int  # upstream 429 answers the request met (retried, or the last one it ended on)
    retry_wait_ms: float  # time waited between attempts (backoff, Retry-After), not upstream time
    max_tokens: int | None  # the output cap the request asked for (None: it set none)


class DayUsage(NamedTuple):
    """The day's usage in the ledger, read in one statement (one snapshot): per project its tokens and US
    dollars, and the ids of the rows flagged ``shared_pending`` (their usage is not in the shared counters
    unless a process adds it: gateway.limits.redis)."""

    tokens: dict[str, int]
    cost: dict[str, float]
    shared_pending: list[str]


class Record:
    """What one client request (or one summaries model call) did; becomes its ledger row and metrics."""

    __slots__ = (
        "request_id", "ts", "t0", "endpoint", "project", "key_id", "public_model", "model_label",
        "upstream_model", "provider", "task", "task_label", "session_id", "stream", "status",
        "http_status", "error_class", "retries", "input_tokens", "output_tokens", "estimated",
        "upstream_t0", "upstream_end", "ttft", "queue_wait", "upstream_request_id", "batch_size",
        "closed", "deployment", "fallback_from", "translation", "cost_usd", "cached_input_tokens",
        "cache_write_tokens", "shared_pending", "settle", "dropped", "rate_limited", "retry_wait",
        "max_tokens", "overhead",
    )  # fmt: skip

    def __init__(self, endpoint: str) -> None:
        self.request_id = f"{_ID_PREFIX}{next(_ID_SEQ):012x}"
        self.ts = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.endpoint = endpoint
        self.project: str | None = None
        self.key_id: str | None = None
        self.public_model: str | None = None
        self.upstream_model: str | None = None
        self.provider: str | None = None
        self.task: str | None = None
        self.session_id: str | None = None
        self.error_class: str | None = None
        self.upstream_request_id: str | None = None
        self.model_label = "unknown"
        self.task_label = "unknown"
        self.stream = False
        self.status = "error"
        self.http_status: int | None = None
        self.retries = self.input_tokens = self.output_tokens = 0
        # parts of input_tokens: cache reads (OpenAI's cached tokens) and Anthropic's cache writes
        self.cached_input_tokens = self.cache_write_tokens = 0
        self.estimated = False
        self.upstream_t0: float | None = None
        self.upstream_end: float | None = None
        self.ttft: float | None = None
        self.queue_wait = 0.0
        self.batch_size: int | None = None
        self.closed = False  # its row is written (only the request path sets this)
        self.deployment: str | None = None
        self.fallback_from: str | None = None
        self.translation: str | None = None
        self.cost_usd: float | None = None
        # admitted on this process's own share of the limits while Redis was unreachable (None: not)
        self.shared_pending: bool | None = None
        # the request path's settlement of its admission, run before the row is written (then None)
        self.settle: Callable[[], None] | None = None
        self.dropped: list[str] = []  # request fields translation left out (gateway.translate.policy)
        self.rate_limited = 0  # upstream 429 answers met (gateway.http.pipeline.send)
        self.retry_wait = 0.0  # seconds waited between the upstream attempts
        self.max_tokens: int | None = None  # the output cap asked for (gateway.http.pipeline.exchange)
        # the gateway's own time (own_time), taken once: when a stream's head goes out, else at the row
        self.overhead: float | None = None

    def tag(self, project: ProjectConfig, task: str | None) -> None:
        """The task (header or the project's default) and its bounded metrics label."""
        self.task = task or project.default_task
        self.task_label = (
            self.task if self.task == project.default_task or self.task in project.tasks else "other"
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def count(self, usage: Usage, estimated: bool) -> None:
        """The answer's tokens, as gateway.core.usage reads them (``estimated``: the estimate, the upstream
        reported no count)."""
        self.input_tokens, self.output_tokens, self.cached_input_tokens, self.cache_write_tokens = usage
        self.estimated = estimated

    def fail(self, status: str, http_status: int | None, error_class: str | None) -> None:
        self.status, self.http_status, self.error_class = status, http_status, error_class

    def row(self, latency_s: float, upstream_s: float | None) -> LedgerRow:
        return {
            "request_id": self.request_id,
            "ts": self.ts,
            "endpoint": self.endpoint,
            "upstream_request_id": self.upstream_request_id,
            "project": self.project,
            "key_id": self.key_id,
            "public_model": self.public_model,
            "upstream_model": self.upstream_model,
            "provider": self.provider,
            "task": self.task,
            "session_id": self.session_id,
            "stream": self.stream,
            "status": self.status,
            "http_status": self.http_status,
            "error_class": self.error_class,
            "retries": self.retries,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokens_estimated": self.estimated,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "latency_ms": latency_s * 1000,
            "upstream_ms": upstream_s * 1000 if upstream_s is not None else None,
            "ttft_ms": self.ttft * 1000 if self.ttft is not None else None,
            "queue_wait_ms": self.queue_wait * 1000,
            "batch_size": self.batch_size,
            "deployment": self.deployment,
            "fallback_from": self.fallback_from,
            "translation": self.translation,
            "cost_usd": self.cost_usd,
            "shared_pending": self.shared_pending,
            "dropped_fields": ",".join(self.dropped) if self.dropped else None,
            "rate_limited": self.rate_limited,
            "retry_wait_ms": self.retry_wait * 1000,
            "max_tokens": self.max_tokens,
        }
