"""Running a sweep: spec -> job rows -> Ray workers -> results streamed into the store.

`run_sweep` connects to Ray first (a cluster that cannot be reached leaves no job behind), then
creates a job with one pending row per trial (streamed into the store in batches) and runs it;
`resume_job` runs the rows of an existing job that are not finished (a finished job is left as it
is). Both go through `_execute`, which builds the dispatcher, feeds it the pending rows a page at a
time and turns its callbacks into store writes and progress output. Ctrl-C (or SIGTERM) at any stage
stops the workers, keeps every finished result and leaves the job `interrupted` and resumable.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cluster import session
from cluster.dispatch import Dispatcher, DispatchOptions, NoWorkersLeft, WorkerResult, WorkItem
from cluster.session import ClusterConnectError, ClusterPlan
from jobs.errors import EXIT_INTERRUPTED, EXIT_NO_WORKERS, InfrastructureError
from jobs.run.farm_metrics import FarmMetrics
from jobs.run.progress import ProgressView
from jobs.run.source import kernels_commit
from jobs.run.verdict import exit_code_of
from jobs.spec.sweep import SweepSpec, dump_spec, loads_spec
from jobs.store import Store, TrialRow
from jobs.store.results import TrialResult
from jobs.store.schema import display_url
from kernels.base import TrialRequest, TrialStatus, trial_label

# Called on the driver after each finished trial with its result and what its worker reported about
# itself (node, gpu_id, pid, ...). Tests and tools that embed the runner use it.
Observer = Callable[[TrialResult, dict[str, Any]], None]


@dataclass
class RunResult:
    job_id: int
    status: str
    counts: dict[str, int]
    exit_code: int
    note: str = ""
    resumed: bool = True  # False: `resume_job` found nothing to run and changed nothing


def create_job(store: Store, spec: SweepSpec) -> int:
    return store.create_job(
        name=spec.name,
        family=spec.family,
        spec_yaml=dump_spec(spec),
        spec_hash=spec.spec_hash(),
        trials=spec.iter_trials(),
        git_commit=kernels_commit(),
    )


@dataclass
class RunOptions:
    address: str | None = None  # join this Ray cluster; None starts a local one
    gpus: int | None = None  # workers: GPUs to use, or logical GPU slots on a CPU-only machine
    show_progress: bool = True
    echo: Callable[[str], None] = print
    observer: Observer | None = None
    metrics: FarmMetrics | None = None  # Prometheus exporter; None: from FARM_METRICS_* (off when unset)
    threads_per_worker: int | None = None  # torch threads per CPU worker; None: the CPUs shared out
    oversubscribe: bool = False  # on CPU, run more timing workers than the cluster has cores
    ready_wait_s: float = 60.0  # dispatch waits this long for every worker to be up


def connect(options: RunOptions) -> ClusterPlan:
    """Start or join Ray; a cluster that cannot be reached or refuses us is an InfrastructureError."""
    try:
        plan = session.connect(options.address, options.gpus, oversubscribe=options.oversubscribe)
    except ClusterConnectError as err:
        raise InfrastructureError(str(err)) from None
    note = plan.note
    asked = options.threads_per_worker
    if asked and plan.threads_per_worker is not None and asked != plan.threads_per_worker:
        # the header says what the workers will run with, not what the plan would have given them
        note = note.replace(
            f"{plan.threads_per_worker} torch thread(s) each",
            f"{asked} torch thread(s) each (set for this run)",
        )
    options.echo(f"ray: {plan.address}; {note}")
    return plan


def run_sweep(spec: SweepSpec, store: Store, options: RunOptions | None = None) -> RunResult:
    """Connect, create the job, run it. A KeyboardInterrupt (or SIGTERM) before the job exists
    propagates, and nothing is stored."""
    options = options or RunOptions()
    with _Interrupt():
        plan = connect(options)
        job_id = create_job(store, spec)  # one transaction: interrupted, it leaves no job
    trials = spec.count_trials()
    options.echo(
        f"job {job_id}: {spec.name} ({spec.family}), {trials} trials, store {display_url(store.url)}"
    )
    return _execute(job_id, spec, store, options, plan)


def resume_job(job_id: int, store: Store, options: RunOptions | None = None) -> RunResult:
    job = store.get_job(job_id)
    if job is None:
        from jobs.errors import NoSuchJob  # exit 2 from the CLI, the message every command gives

        raise NoSuchJob(job_id, store.url)
    spec = loads_spec(job.spec, source=f"job {job_id} spec")
    options = options or RunOptions()
    counts = store.status_counts(job_id)
    if not counts.get(TrialStatus.PENDING):
        # A finished job is not touched: status, finish time and verdict stay as they are.
        if job.status not in ("completed", "failed"):  # stopped right after its last trial finished
            store.set_job_status(job_id, "completed")
            job = store.get_job(job_id)
        when = f" at {job.finished_at:%Y-%m-%d %H:%M:%S}" if job.finished_at else ""
        note = f"nothing to resume: job {job_id} already finished ({job.status}{when}); left as it is"
        return RunResult(job_id, job.status, counts, exit_code_of(counts), note, resumed=False)
    with _Interrupt():
        plan = connect(options)
    return _execute(job_id, spec, store, options, plan)


class _StoreListener:
    """Dispatcher callbacks -> buffered store writes (flushed every 50 ms or 32 results) + progress."""

    FLUSH_S, FLUSH_N = 0.05, 32

    def __init__(self, store: Store, progress: ProgressView, observer: Observer | None = None):
        self.observer = observer
        self.store = store
        self.progress = progress
        self.workers: dict[str, dict[str, Any]] = {}
        self.buffer: list[TrialResult] = []
        self.last_flush = time.monotonic()

    def _where(self, item: WorkItem, slot: str) -> dict[str, Any]:
        """Where a trial ran, as its TrialResult records it."""
        info = self.workers.get(slot, {})
        return {
            "attempt": item.attempts + 1,
            "node": info.get("node"),
            "worker": slot,
            "gpu_id": info.get("gpu_id"),
            "gpu_type": info.get("gpu_type"),
            "environment": info.get("environment"),
        }

    def _add(self, result: TrialResult) -> None:
        self.buffer.append(result)
        self.progress.finished(result.status, result.node)
        if len(self.buffer) >= self.FLUSH_N or time.monotonic() - self.last_flush > self.FLUSH_S:
            self.flush()
        if self.observer:
            self.observer(result, self.workers.get(result.worker or "", {}))

    def flush(self) -> None:
        if self.buffer:
            self.store.record_results(self.buffer)
            self.buffer = []
        self.last_flush = time.monotonic()

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        nice = info.get("niceness") or 0
        if nice > 0 and not any((w.get("niceness") or 0) > 0 for w in self.workers.values()):
            self.progress.log(
                f"worker {slot} times at niceness {nice} (the cluster's RAY_worker_niceness; Ray's default "
                "is 15): its timings yield to every other process on the node; start Ray with "
                "RAY_worker_niceness=0 for timings that hold on a shared machine"
            )
        self.workers[slot] = info
        self.progress.worker(slot, info)

    def dispatch_started(self, ready: int, wanted: int, waited_s: float) -> None:
        if ready < wanted:
            self.progress.log(
                f"dispatching on {ready} of {wanted} workers: {wanted - ready} not ready after "
                f"{waited_s:.0f} s (trials go to the ready ones)"
            )

    def worker_lost(self, slot: str, reason: str, retired: bool) -> None:
        self.progress.log(f"worker {slot} {'retired' if retired else 'replaced'}: {reason}")

    def trial_started(self, item: WorkItem, slot: str) -> None:
        self.progress.started()

    def trial_finished(self, item: WorkItem, slot: str, result: WorkerResult) -> None:
        self._add(
            TrialResult(
                item.trial_id,
                result.outcome,
                started_at=_dt(result.started),
                finished_at=_dt(result.finished),
                **self._where(item, slot),
            )
        )

    def trial_timed_out(self, item: WorkItem, slot: str, seconds: float) -> None:
        error = f"stopped after {seconds:.1f} s (timeout_s); its worker was killed"
        self._add(TrialResult.ended(item.trial_id, TrialStatus.TIMEOUT, error, **self._where(item, slot)))
        self.progress.log(f"timeout: {item.label} on {slot}")

    def trial_crashed(self, item: WorkItem, slot: str, error: str, final: bool) -> None:
        self.progress.log(f"worker {slot} died under {item.label} (attempt {item.attempts}): {error}")
        if final:
            why = f"worker died on all {item.attempts} attempts; last: {error}"
            where = {**self._where(item, slot), "attempt": item.attempts}
            self._add(TrialResult.ended(item.trial_id, TrialStatus.CRASHED, why, **where))
        else:
            self.flush()
            self.store.mark_attempt(item.trial_id, item.attempts, error)
            self.progress.retrying()


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC).replace(tzinfo=None) if ts else None


@dataclass
class _Interrupt:
    """SIGTERM raises KeyboardInterrupt once; a second signal while the first is being handled (workers
    stopped, results flushed, the job marked) is ignored, so that clean-up is never cut short."""

    previous: dict[int, Any] = field(default_factory=dict)
    fired: bool = False

    def __enter__(self) -> _Interrupt:
        def raise_interrupt(signum: int, frame: Any) -> None:
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt

        try:
            self.previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, raise_interrupt)
        except ValueError:  # not the main thread: leave signals alone
            pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _execute(job_id: int, spec: SweepSpec, store: Store, options: RunOptions, plan: ClusterPlan) -> RunResult:
    counts = store.status_counts(job_id)
    total, todo = sum(counts.values()), counts.get(TrialStatus.PENDING, 0)
    items = (_work_item(t, spec) for t in store.iter_unfinished_trials(job_id))
    store.set_job_status(job_id, "running", cluster=plan.to_dict(), message=None)
    progress = ProgressView(
        total=total, already=total - todo, enabled=options.show_progress, echo=options.echo
    )
    listener = _StoreListener(store, progress, options.observer)
    metrics = options.metrics or FarmMetrics.from_env(echo=options.echo)
    dispatcher = Dispatcher(
        DispatchOptions(
            workers=plan.workers,
            gpu=plan.gpu,
            timeout_s=spec.timeout_s,
            max_attempts=spec.max_attempts,
            threads_per_worker=options.threads_per_worker or plan.threads_per_worker,
            ready_wait_s=options.ready_wait_s,
            name_prefix=f"kf-job{job_id}-{int(time.time() * 1000) % 10**8}",
        ),
        metrics.listen(listener) if metrics else listener,
    )
    progress.inflight = lambda: dispatcher.snapshot().in_flight
    status, note, code = "completed", "", None
    backends = [b.name for b in spec.backends]
    watch = metrics.job(spec.family, backends, dispatcher) if metrics else nullcontext()
    with _Interrupt(), progress, watch:
        try:
            dispatcher.run(items, total=todo)
        except KeyboardInterrupt:
            status, code = "interrupted", EXIT_INTERRUPTED
            note = f"interrupted; finished trials are stored. Resume with: farm sweep resume {job_id}"
        except NoWorkersLeft as err:
            status, code, note = "failed", EXIT_NO_WORKERS, str(err)
        except Exception as err:  # the job must not stay "running": record the failure, then raise it
            listener.flush()
            store.set_job_status(job_id, "failed", message=f"driver error: {err!r}; resume to finish")
            raise
        finally:
            listener.flush()
    counts = store.status_counts(job_id)
    store.set_job_status(job_id, status, message=note or None)
    return RunResult(job_id, status, counts, code if code is not None else exit_code_of(counts), note)


def _work_item(row: TrialRow, spec: SweepSpec) -> WorkItem:
    """A stored trial as the dispatcher runs it."""
    request = TrialRequest(row.family, row.backend, row.shape, row.config, row.dtype, policy=spec.measure)
    label = trial_label(row.backend, row.shape, row.config, row.dtype, seq=row.seq)
    return WorkItem(trial_id=row.id, attempts=row.attempt, label=label, request=request)
