"""The pool: one set of warm workers per cluster serving the trials of every queued job (`farm pool serve`).

The dispatcher (cluster.dispatch) runs with its workers kept up between jobs; its source asks the queue
(jobs.queue.queue) for the next trial each time a worker has room, so a job of higher priority submitted
while a long sweep runs gets the next free worker, about one trial's time after it is submitted. Results
are written as the runner writes them (its store listener); a job whose last trial is written is marked
completed. Each turn of the dispatcher's loop (at least every TICK_S) the pool beats (its claims stay
valid) and looks for cancelled jobs: their queued trials leave the dispatcher and a worker running one is
killed and replaced. The pool follows the cluster: the trials in flight on a node that is lost run again
on the others (its workers' slots wait for a GPU to come back), and a node that joins gets workers of its
own within FOLLOW_S. A job submitted with kernels/ other than the pool's own (cluster.shipping) runs on
workers started with its shipped source.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import ray

from cluster import session
from cluster.dispatch import TICK_S, Dispatcher, DispatchOptions, WorkItem
from cluster.shipping import pack_kernels
from jobs.queue import notify
from jobs.queue.fairshare import JobState, RunningTrial, fits
from jobs.queue.policy import Policy
from jobs.queue.pool_metrics import PoolMetrics
from jobs.queue.queue import Claimed, Queue
from jobs.run.progress import ProgressView
from jobs.run.runner import RunOptions, _StoreListener, connect
from jobs.spec.sweep import SweepSpec, loads_spec
from jobs.store import Store
from jobs.store.results import TrialResult
from jobs.store.schema import display_url
from kernels.base import TrialRequest, trial_label

BEAT_S = 5.0  # how often the pool writes that it is alive (queue.POOL_STALE_S is 6x this)
FOLLOW_S = 1.0  # how often the pool asks the cluster whether it has room for more workers (nodes joined)


@dataclass
class PoolOptions:
    run: RunOptions = field(default_factory=RunOptions)
    idle_exit_s: float | None = None  # stop after this long with nothing to do (tests, CI); None: never
    timeout_s: float = 600.0  # a trial's limit when its job's spec gives none
    stop: threading.Event = field(default_factory=threading.Event)  # set it to stop the pool
    on_finished: Callable[[int], None] | None = None  # called with each job the pool completes
    notified: list[threading.Thread] = field(default_factory=list)  # webhook posts under way (tests join)
    policy: Policy = field(default_factory=Policy)  # fair share, quotas, preemption (jobs.queue.policy)
    # the pool's Prometheus metrics (jobs.queue.pool_metrics); None: served on FARM_METRICS_PORT if set
    metrics: PoolMetrics | None = None


class _Source:
    """The dispatcher's source: every ask takes the next trial from the queue; StopIteration when none
    is there now (the dispatcher asks again at its next turn)."""

    def __init__(
        self,
        queue: Queue,
        pool: str,
        default_timeout_s: float,
        own_source: str | None,
        gpu_types: dict[str | None, int] | None = None,
    ) -> None:
        self.queue, self.pool, self.default_timeout_s = queue, pool, default_timeout_s
        self.gpu_types = dict(gpu_types or {None: 1})  # the pool's workers per GPU type
        self.own_source = own_source  # the digest of the pool's own kernels/: its jobs need no shipped copy
        self._archives: dict[str, object] = {}  # digest -> object ref of its packed kernels/
        self.job_of: dict[int, int] = {}  # trial -> job, of the trials taken and not finished
        self.owner_of: dict[int, str] = {}  # job -> owner, charged for its trials' worker time
        self.used_s: dict[str, float] = {}  # worker-seconds not yet charged, per owner
        self._specs: dict[int, SweepSpec] = {}
        self.run = RunOptions()  # the pool's (its echo, --gpus, --oversubscribe)
        self.metrics: PoolMetrics | None = None
        self.room: dict[str | None, int] = {}  # workers free per GPU type at the dispatcher's last turn
        self.held: dict[str | None, list[Claimed]] = {}  # claimed, not yet handed to the dispatcher
        self.lines: list[tuple[int, str]] = []  # job-log lines not yet written

    def __iter__(self) -> _Source:
        return self

    def __next__(self) -> WorkItem:
        """A trial for a worker of any of the pool's GPU types (the first type that has one)."""
        for gpu_type in self.gpu_types:
            item = self.take(gpu_type)
            if item is not None:
                return item
        raise StopIteration

    def take(self, gpu_type: str | None) -> WorkItem | None:
        """The next trial for a free worker of `gpu_type` (cluster.dispatch asks per slot), or None. The
        queue is asked once for as many trials as the pool had workers of that type free at its last
        turn (`room`): one transaction for all of them, each trial's "taken" line in it; the dispatcher's
        next asks in the same turn are answered from those."""
        held = self.held.setdefault(gpu_type, [])
        if not held:
            n = max(1, self.room.pop(gpu_type, 0))
            for got in self.queue.claim_many(self.pool, gpu_type, n, logged=True):
                self.job_of[got.trial.id] = got.job.id
                self.owner_of[got.job.id] = got.owner
                held.append(got)
        return self._item(held.pop(0), gpu_type) if held else None

    def _item(self, got: Claimed, gpu_type: str | None) -> WorkItem:
        t, job = got.trial, got.job
        spec = self._specs.get(job.id)
        if spec is None:
            spec = self._specs[job.id] = loads_spec(self.queue.spec(job.id), source=f"job {job.id} spec")
        if self.metrics is not None:
            self.metrics.waited(got.owner, got.waited_s)
        request = TrialRequest(t.family, t.backend, t.shape, t.config, t.dtype, policy=spec.measure)
        label = f"job {job.id} " + trial_label(t.backend, t.shape, t.config, t.dtype, seq=t.seq)
        source = got.source_digest if got.source_digest != self.own_source else None
        need = JobState(job.id, got.owner, 0, 0.0, 0, gpu_type=spec.gpu and spec.gpu.type,
                        min_memory_gb=spec.gpu and spec.gpu.min_memory_gb)  # fmt: skip
        types = frozenset(t for t in self.gpu_types if fits(need, t, self.queue.current_policy()))
        return WorkItem(
            t.id, request, label, attempts=t.attempt,
            timeout_s=spec.timeout_s or self.default_timeout_s, source=source, gpu_types=types,
            claimed_for=gpu_type,
        )  # fmt: skip

    def unheld(self, jobs: set[int]) -> list[int]:
        """Forget the claimed trials of these jobs not yet handed to a worker; their ids."""
        out = []
        for gpu_type, held in self.held.items():
            out += [c.trial.id for c in held if c.job.id in jobs]
            self.held[gpu_type] = [c for c in held if c.job.id not in jobs]
        return out

    def note(self, job_id: int, line: str) -> None:
        """A line for the job's log, written with the others at the pool's next turn (`write_lines`)."""
        self.lines.append((job_id, line))

    def write_lines(self) -> None:
        if self.lines:
            self.queue.log_many(self.lines)
            self.lines = []

    def used(self, trial_id: int, seconds: float) -> None:
        """A worker spent `seconds` on the trial: its job's owner is charged (at the next `charge`)."""
        owner = self.owner_of.get(self.job_of.get(trial_id, -1))
        if owner is not None and seconds > 0:
            self.used_s[owner] = self.used_s.get(owner, 0.0) + seconds

    def charge(self) -> None:
        if self.used_s:
            self.queue.charge(self.used_s)
            self.used_s = {}

    def archive(self, digest: str) -> object:
        """The packed kernels/ of a digest, put in Ray's object store once (a worker's node fetches it)."""
        ref = self._archives.get(digest)
        if ref is None:
            data = self.queue.source_archive(digest)
            if data is None:
                raise LookupError(f"kernel source {digest[:12]} is not in the store")
            ref = self._archives[digest] = ray.put(data)
        return ref


def serve(store: Store, options: PoolOptions | None = None) -> int:
    """Serve the queue until `options.stop` is set (or `idle_exit_s` passes with nothing to do). Returns
    the number of jobs completed."""
    options = options or PoolOptions()
    run = options.run
    plan = connect(run)
    queue = Queue(store, options.policy)
    pool = f"pool-{uuid.uuid4().hex[:12]}"
    queue.register_pool(pool, plan.workers, plan.gpu_types)
    run.echo(f"pool {pool}: {plan.note}; serving the queue of {display_url(store.url)}")
    try:
        own = pack_kernels().digest
    except (OSError, ValueError):  # no readable kernels/ tree here: every shipped job gets its own workers
        own = None
    source = _Source(queue, pool, options.timeout_s, own, plan.gpu_types)
    source.run = run
    source.metrics, own_metrics = _metrics(options, queue)
    progress = ProgressView(total=0, enabled=False, echo=run.echo)

    def observe(result: TrialResult, worker: dict) -> None:
        job_id = source.job_of.get(result.trial_id)
        if job_id is not None:
            source.note(job_id, _finished_line(result))
            if result.started_at and result.finished_at:
                source.used(result.trial_id, (result.finished_at - result.started_at).total_seconds())
        if run.observer is not None:
            run.observer(result, worker)

    listener = _StoreListener(store, progress, observe)
    dispatcher = Dispatcher(
        DispatchOptions(
            workers=plan.workers,
            gpu=plan.gpu,
            timeout_s=options.timeout_s,
            pipeline=1,  # nothing queued on a worker ahead of a higher-priority job's trial
            lookahead=1,  # trials are taken from the queue only when a worker has room
            threads_per_worker=run.threads_per_worker or plan.threads_per_worker,
            ready_wait_s=run.ready_wait_s,
            name_prefix=pool,
            source_archive=source.archive,
            gpu_types=plan.gpu_types or None,
        ),
        listener,
    )
    completed = 0
    last_beat, last_follow = 0.0, time.monotonic()

    def tick(d: Dispatcher) -> None:
        nonlocal completed, last_beat, last_follow
        beat = time.monotonic() - last_beat >= BEAT_S
        if beat:
            queue.beat(pool, _load(d, source))
            last_beat = time.monotonic()
        if time.monotonic() - last_follow >= FOLLOW_S:
            _follow(d, plan, source, pool)
            last_follow = time.monotonic()
        source.room = _room(d)
        listener.flush()
        wrote = bool(source.lines)  # a result came since the last turn: a job may have ended
        source.write_lines()
        source.charge()
        # finished jobs looked for after a turn that wrote a result, and at each beat (another pool serving
        # the same job may have written its last); cancelled ones at every turn, by the same statement
        finishing = wrote or beat
        done, gone = queue.settle(set(source.job_of.values()), finish=finishing)
        if finishing:
            completed += _finish(queue, source, options, done)
        _cancel(d, queue, source, pool, options, gone)
        _preempt(d, queue, source, pool)
        if options.stop.is_set():
            d.stop()

    dispatcher.tick = tick
    idle_since = time.monotonic()
    try:
        while not options.stop.is_set():
            dispatcher.run(source, keep_workers=True)
            tick(dispatcher)
            busy = bool(source.job_of)
            if busy:
                idle_since = time.monotonic()
            elif options.idle_exit_s is not None and time.monotonic() - idle_since >= options.idle_exit_s:
                break
            options.stop.wait(TICK_S)  # nothing to take now: look at the queue again
    finally:
        if own_metrics:
            source.metrics.close()
        listener.flush()
        source.write_lines()
        source.charge()
        completed += _finish(queue, source, options)
        dispatcher.shutdown()
        queue.unregister_pool(pool)  # trials taken and not finished go back to the queue
    return completed


def _follow(d: Dispatcher, plan: session.ClusterPlan, source: _Source, pool: str) -> None:
    """Nodes that joined (or came back): one more worker per GPU they bring, of their GPU type, up to
    --gpus."""
    run = source.run
    try:
        room = session.gpu_types_now(plan, run.gpus, oversubscribe=run.oversubscribe)
        room = room or {None: session.workers_now(plan, run.gpus, oversubscribe=run.oversubscribe)}
    except Exception:  # noqa: BLE001 - Ray's GCS did not answer now: ask again next time
        return
    added = sum(d.grow(n, gpu_type) for gpu_type, n in room.items())
    if added:
        source.gpu_types |= room
        run.echo(f"pool {pool}: {added} worker(s) added, the cluster has room for {sum(room.values())} now")


def _metrics(options: PoolOptions, queue: Queue) -> tuple[PoolMetrics | None, bool]:
    """The caller's metrics, or ones served on FARM_METRICS_PORT (closed with the pool: True)."""
    if options.metrics is not None:
        return options.metrics, False
    from jobs.settings import FarmSettings

    settings = FarmSettings.load()
    if settings.metrics_port is None:
        return None, False
    metrics = PoolMetrics(queue)
    options.run.echo(f"pool metrics: {metrics.serve(settings.metrics_port, settings.metrics_addr)}")
    return metrics, True


def _room(d: Dispatcher) -> dict[str | None, int]:
    """Workers ready with nothing in flight, per GPU type: the trials the next turn will ask for."""
    out: dict[str | None, int] = {}
    for slot in d.snapshot().slots:
        if slot.ready and not slot.retired and not slot.in_flight:
            out[slot.gpu_type] = out.get(slot.gpu_type, 0) + 1
    return out


def _load(d: Dispatcher, source: _Source) -> dict[str, dict]:
    """What the pool's workers run now, per GPU type: workers ready and the owners of their trials."""
    out: dict[str, dict] = {}
    for slot in d.snapshot().slots:
        if slot.retired:
            continue
        here = out.setdefault(slot.gpu_type or "", {"workers": 0, "running": {}})
        here["workers"] += 1
        owners = {source.owner_of.get(source.job_of.get(t, -1)) for t in slot.running} - {None}
        for owner in owners:
            here["running"][owner] = here["running"].get(owner, 0) + 1
    return out


def _cancel(
    d: Dispatcher, queue: Queue, source: _Source, pool: str, options: PoolOptions, gone: set[int]
) -> None:
    """Cancelled jobs (`gone`, Queue.settle's): their queued trials leave the dispatcher, a worker running
    one is replaced."""
    if gone:
        dropped = d.drop(lambda item: source.job_of.get(item.trial_id) in gone)
        queue.release([item.trial_id for item in dropped] + source.unheld(gone))
        source.job_of = {t: j for t, j in source.job_of.items() if j not in gone}  # done with them
        for job_id in gone:
            tell(queue, job_id, options)
        source.run.echo(
            f"pool {pool}: cancelled job(s) {sorted(gone)}: {len(dropped)} trial(s) stopped or unqueued"
        )


def _preempt(d: Dispatcher, queue: Queue, source: _Source, pool: str) -> int:
    """With preemption on (jobs.queue.policy.Preemption): for each GPU type whose workers are all busy
    (none free or starting), stop the running trial fairshare names (Plan.pick_victim) for the job next
    in line. The trial goes back to the queue with its attempt unchanged (its worker is replaced and never
    reports it, so it is written once, when it runs again); the time it had run is charged and kept as
    the preemption's. Returns the trials stopped."""
    policy = queue.current_policy()
    if not policy.preempt.enabled:
        return 0
    snap, at = d.snapshot(), time.monotonic()
    plan = queue.plan(policy)
    stopped = 0
    for gpu_type in {s.gpu_type for s in snap.slots if not s.retired}:
        slots = [s for s in snap.slots if s.gpu_type == gpu_type and not s.retired]
        if any(not s.ready or not s.in_flight for s in slots):
            continue  # a worker of this type is free or starting: it takes the next trial
        running = [(t, s.head_started) for s in slots for t in s.running if t in source.job_of]
        last = queue.last_preempted([t for t, _ in running])
        trials = [RunningTrial(t, source.job_of[t], gpu_type, plan.now_s - (at - began), last.get(t))
                  for t, began in running]  # fmt: skip
        victim = plan.pick_victim(trials, gpu_type, list(source.gpu_types))
        if victim is None:
            continue
        waiting = plan.pick(gpu_type)
        why = f"job {waiting.job_id} (priority {waiting.priority}, {waiting.owner}) has more right to it"
        if not d.drop(lambda item, t=victim.trial_id: item.trial_id == t, reason=f"preempted: {why}"):
            continue
        ran = max(0.0, plan.now_s - victim.started_s)
        source.used(victim.trial_id, ran)
        queue.preempted(victim.trial_id, victim.job_id, pool, ran, why)
        source.job_of.pop(victim.trial_id, None)
        stopped += 1
    return stopped


def _finish(queue: Queue, source: _Source, options: PoolOptions, done: list[int] | None = None) -> int:
    """Complete the jobs whose trials are all written (`done`: those Queue.settle completed; None: asked
    now); forget their trials."""
    if done is None:
        done = queue.finish(set(source.job_of.values()))
    if done:
        finished = set(done)
        source.job_of = {t: j for t, j in source.job_of.items() if j not in finished}
        for job_id in done:
            options.run.echo(f"job {job_id}: completed")
            tell(queue, job_id, options)
            if options.on_finished is not None:
                options.on_finished(job_id)
    return len(done)


def tell(queue: Queue, job_id: int, options: PoolOptions) -> None:
    """Post the job's verdict to its webhook, if it has one (jobs.queue.notify)."""
    entry = queue.entry(job_id)
    if entry is None or not entry.notify:
        return
    body = notify.payload(queue.store, job_id)
    options.notified.append(notify.post(entry.notify, body, lambda line: queue.log(job_id, line)))


def _finished_line(result: TrialResult) -> str:
    """The job-log line of a finished trial: its status, where it ran, its median or its error's last line."""
    out = result.outcome
    line = f"trial {result.trial_id} {out.status} on {result.worker} ({result.node})"
    if out.median_ns:
        line += f", median {out.median_ns / 1e3:.1f} us"
    if out.error:
        line += ": " + out.error.strip().splitlines()[-1][:200]
    return line
