"""The queue on the results store's queue tables (jobs.store.tables.queue): submit, take the next trial,
cancel, finish, charge what each owner used, and what `farm jobs list` shows of it.

Order: jobs.queue.fairshare decides which job a free worker serves, from the queue's state read here
(`state`: each waiting job's trials queued and running, when it last got a worker, its GPU need; each
owner's usage decayed to now) and the pool's policy (jobs.queue.policy): aged jobs first, then priority,
then fair share by project and owner, then job by job inside an owner. Inside a job, trials go in grid
order. Every step is a statement on the store, so several pools, or several submitters, can use one store
at once (PostgreSQL for a team): a trial is taken by inserting its claim (the claim's key is the trial),
and written once (the store's pending -> finished rule). Usage is remembered in the store (owner_usage),
so a pool that restarts still knows who had the cluster yesterday.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from cluster.shipping import PackedSource
from jobs.queue.claims import (
    WAITING,
    Progress,
    TrialCounts,
    claim_first,
    claimed_status,
    progress,
    waiting_jobs,
)
from jobs.queue.fairshare import JobState, Plan, decayed
from jobs.queue.policy import Policy
from jobs.spec.sweep import SweepSpec, dump_spec
from jobs.store import (
    PENDING,
    Job,
    JobEvent,
    KernelSource,
    OwnerUsage,
    Pool,
    QueuedJob,
    Store,
    TrialClaim,
    TrialPreemption,
    TrialRow,
    now,
)

POOL_STALE_S = 30.0  # a pool not seen for this long is gone: its claims are void


@dataclass(frozen=True)
class Claimed:
    trial: TrialRow
    job: Job  # without its spec (a large grid's is megabytes): Queue.spec reads it
    source_digest: str | None = None  # the kernels/ shipped with the job (None: the pool's own)
    owner: str = ""  # who is charged for the worker's time
    waited_s: float = 0.0  # how long its job had waited for a worker


@dataclass(frozen=True)
class QueueLine:
    """A queued or running job as `farm jobs list` shows it."""

    job: Job  # without its spec (Queue.spec reads it)
    priority: int
    owner: str
    place: int | None  # 1: served first; None: running (its trials are being taken)
    total: int
    finished: int
    taken: int  # trials running now
    eta_s: float | None  # its trials left at its newest written ones' mean duration, as many at once as now
    waiting: str | None = None  # why it gets no worker whatever is free (quota, GPU type), else None
    project: str | None = None


@dataclass(frozen=True)
class Served:
    """What the live pools serve by: the policy of the one seen last, and the GPU types of all of them
    (type -> workers; None: an untyped cluster). No pool alive: the default policy, no types known."""

    policy: Policy
    gpu_types: dict[str | None, int]


def seconds_of(at: datetime) -> float:
    """A stored (naive UTC) time on the clock fairshare takes."""
    return at.replace(tzinfo=UTC).timestamp()


def default_owner() -> str:
    """The submitting user's login name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        return f"uid {os.getuid()}"


class Queue:
    def __init__(self, store: Store, policy: Policy | None = None) -> None:
        """`policy`: what this process serves by (a pool's); None: the live pool's, read when needed."""
        self.store = store
        self.engine = store.engine
        self.policy = policy

    # ---- submitting --------------------------------------------------------------------------------
    def submit(
        self,
        spec: SweepSpec,
        *,
        priority: int = 0,
        owner: str | None = None,
        source: str | None = None,
        packed: PackedSource | None = None,
        notify: str | None = None,
        project: str | None = None,
    ) -> int:
        """Create the job (every trial pending) and put it in the queue; returns its id at once. `packed`:
        the kernels/ its trials run on (stored once per content); None: the pool's own. `project`: the
        project it is charged to when the pool's policy does not place its owner in one."""
        if packed is not None:
            self._keep_source(packed)
        job_id = self.store.create_job(
            name=spec.name, family=spec.family, spec_yaml=dump_spec(spec),
            spec_hash=spec.spec_hash(), trials=spec.iter_trials(), git_commit=source,
        )  # fmt: skip
        with Session(self.engine) as s, s.begin():
            who = owner or default_owner()
            s.add(
                QueuedJob(
                    job_id=job_id,
                    priority=priority,
                    owner=who,
                    source=source,
                    notify=notify or spec.notify,
                    source_digest=packed.digest if packed is not None else None,
                    project=project,
                    gpu_type=spec.gpu.type if spec.gpu else None,
                    min_gpu_memory_gb=spec.gpu.min_memory_gb if spec.gpu else None,
                )  # fmt: skip
            )
            s.add(JobEvent(job_id=job_id, line=f"queued by {who} at priority {priority}"))
            s.execute(update(Job).where(Job.id == job_id).values(status="queued"))
        return job_id

    def _keep_source(self, packed: PackedSource) -> None:
        if self.source_archive(packed.digest) is not None:
            return
        try:
            with Session(self.engine) as s, s.begin():
                s.add(KernelSource(digest=packed.digest, archive=packed.archive, files=packed.files))
        except IntegrityError:  # another submitter stored the same content first
            pass

    def spec(self, job_id: int) -> str:
        """The job's spec as submitted (YAML), what a claimed trial's job is read without."""
        with Session(self.engine) as s:
            found = s.scalar(select(Job.spec).where(Job.id == job_id))
        if found is None:
            raise LookupError(f"job {job_id} is not in the store")
        return found

    def source_archive(self, digest: str) -> bytes | None:
        """The packed kernels/ of that digest, or None when the store has none."""
        with Session(self.engine) as s:
            return s.scalar(select(KernelSource.archive).where(KernelSource.digest == digest))

    # ---- taking trials -----------------------------------------------------------------------------
    def claim(self, pool: str, gpu_type: str | None = None) -> Claimed | None:
        """Take the next trial for a free worker of `gpu_type` of `pool` (see the module docstring for
        the order), or None when no job has a pending trial nobody has taken that it may run now."""
        got = self.claim_many(pool, gpu_type, 1)
        return got[0] if got else None

    def claim_many(
        self, pool: str, gpu_type: str | None = None, n: int = 1, *, logged: bool = False
    ) -> list[Claimed]:
        """Take the next `n` trials for free workers of `gpu_type` (fewer when fewer may run now), in the
        order `n` claims one after another would take them, in one transaction: the queue read once, the
        picks made on it (fairshare's Plan.take counts each one before the next), each chosen job's
        first trials claimed in grid order (on PostgreSQL one statement for all: claims.claim_first).
        `logged`: each trial's "taken" line goes in the job's log in the same transaction."""
        policy = self.current_policy()
        for _ in range(8):  # another pool took a trial between the read and the insert: look again
            try:
                with Session(self.engine, expire_on_commit=False) as s, s.begin():
                    at = now()
                    jobs, usage = self._state(s, at, policy, cap=None if _counts_matter(policy) else n)
                    plan = Plan(jobs, usage, policy, seconds_of(at))
                    picks = _picks(plan, gpu_type, n)
                    got = self._take(s, pool, picks, at, logged)
            except IntegrityError:
                continue
            return got
        return []

    def _take(
        self, s: Session, pool: str, picks: list[JobState], at: datetime, logged: bool
    ) -> list[Claimed]:
        """Claim the trials of `picks` (one per pick, a job's in grid order); what was taken."""
        wanted = Counter(job.job_id for job in picks)
        found = claim_first(s, wanted, pool, at)
        out: list[Claimed] = []
        for j in picks:  # in the order picked; a job with fewer trials than picks gives what it has
            if found[j.job_id]:
                t, job, digest = found[j.job_id].pop(0)
                out.append(Claimed(t, job, digest, j.owner, j.waited(seconds_of(at))))
        if not out:
            return out
        taken = sorted({c.job.id for c in out})
        s.execute(update(QueuedJob).where(QueuedJob.job_id.in_(taken)).values(last_taken_at=at))
        if any(c.job.status == "queued" for c in out):
            s.execute(
                update(Job)
                .where(Job.id.in_(taken), Job.status == "queued")
                .values(status="running", started_at=func.coalesce(Job.started_at, now()))
            )
        if logged:
            lines = [{"job_id": c.job.id, "line": f"trial #{c.trial.seq} taken by {pool}"} for c in out]
            s.execute(insert(JobEvent), lines)
        return out

    def state(
        self, policy: Policy | None = None, counts: TrialCounts | None = None
    ) -> tuple[list[JobState], dict[str, float], float]:
        """The queue as fairshare sees it now: the waiting and running jobs, each owner's decayed usage,
        and the time (fairshare's clock); `counts`: the jobs' trials by status, read once for a listing
        (their waiting trials taken from them)."""
        policy = policy or self.current_policy()
        with Session(self.engine) as s:
            at = now()
            jobs, usage = self._state(s, at, policy, counts=counts)
        return jobs, usage, seconds_of(at)

    def plan(self, policy: Policy | None = None, counts: TrialCounts | None = None) -> Plan:
        policy = policy or self.current_policy()
        jobs, usage, at = self.state(policy, counts)
        return Plan(jobs, usage, policy, at)

    @staticmethod
    def _state(
        s: Session, at: datetime, policy: Policy, *, cap: int | None = None, counts: TrialCounts | None = None
    ) -> tuple[list[JobState], dict[str, float]]:
        """`cap`: each job's waiting trials counted up to this many (enough for `cap` picks, and flat in
        a large job); None: every one counted (what queued-trial quotas need); `counts`: taken from these
        (`farm jobs list`: each job's trials counted once for the listing)."""
        jobs = [
            JobState(
                w.entry.job_id,
                w.entry.owner,
                w.entry.priority,
                seconds_of(w.entry.submitted_at),
                queued=w.waiting,
                running=w.running,
                last_taken_s=seconds_of(w.entry.last_taken_at) if w.entry.last_taken_at else None,
                project=w.entry.project,
                gpu_type=w.entry.gpu_type,
                min_memory_gb=w.entry.min_gpu_memory_gb,
            )  # fmt: skip
            for w in waiting_jobs(s, cap, counts)
        ]
        usage = {
            u.owner: decayed(u.usage_s, (at - u.at).total_seconds(), policy.half_life)
            for u in s.scalars(select(OwnerUsage))
        }
        return jobs, usage

    def charge(self, used_s: Mapping[str, float]) -> None:
        """Add worker-seconds to owners' usage (decayed to now first: one half-life ago counts half)."""
        half_life = self.current_policy().half_life
        for owner, seconds in sorted(used_s.items()):
            if seconds <= 0:
                continue
            for _ in range(4):  # two pools charging one new owner at once: the second adds to the first's
                try:
                    with Session(self.engine) as s, s.begin():
                        at, row = now(), s.get(OwnerUsage, owner, with_for_update=True)
                        if row is None:
                            s.add(OwnerUsage(owner=owner, usage_s=seconds, at=at))
                        else:
                            age = (at - row.at).total_seconds()
                            row.usage_s, row.at = decayed(row.usage_s, age, half_life) + seconds, at
                    break
                except IntegrityError:
                    continue

    def usage(self) -> dict[str, float]:
        """Each owner's past usage in worker-seconds, decayed to now."""
        return self.state()[1]

    def preempted(self, trial_id: int, job_id: int, pool: str, ran_s: float, why: str) -> None:
        """A pool stopped this running trial for a job with more right to its worker: the preemption is
        kept, the claim given back (the trial, still pending with its attempt unchanged, is taken again
        in its turn), the job's log says why. One transaction."""
        with Session(self.engine) as s, s.begin():
            s.add(TrialPreemption(trial_id=trial_id, job_id=job_id, pool=pool, ran_s=ran_s))
            s.execute(delete(TrialClaim).where(TrialClaim.trial_id == trial_id, TrialClaim.pool == pool))
            s.add(
                JobEvent(
                    job_id=job_id, line=f"trial {trial_id} preempted by {pool} after {ran_s:.1f} s: {why}"
                )
            )

    def last_preempted(self, trial_ids: list[int]) -> dict[int, float]:
        """When each of these trials was last preempted (fairshare's clock), for those that were."""
        if not trial_ids:
            return {}
        q = (
            select(TrialPreemption.trial_id, func.max(TrialPreemption.at))
            .where(TrialPreemption.trial_id.in_(trial_ids))
            .group_by(TrialPreemption.trial_id)
        )
        with self.engine.connect() as conn:
            return {t: seconds_of(at) for t, at in conn.execute(q)}

    def preemptions(self) -> tuple[int, float]:
        """Preemptions so far and the worker-seconds they lost."""
        with self.engine.connect() as conn:
            n, lost = conn.execute(
                select(func.count(), func.coalesce(func.sum(TrialPreemption.ran_s), 0.0))
            ).one()
        return int(n), float(lost)

    def release(self, trial_ids: list[int]) -> None:
        """Give back trials a pool took and did not finish (a cancelled job's, a stopping pool's)."""
        if trial_ids:
            with self.engine.begin() as conn:
                conn.execute(delete(TrialClaim).where(TrialClaim.trial_id.in_(trial_ids)))

    # ---- what happened ------------------------------------------------------------------------------
    def log(self, job_id: int, line: str) -> None:
        self.log_many([(job_id, line)])

    def log_many(self, lines: list[tuple[int, str]]) -> None:
        """Lines for jobs' logs, in this order, in one statement."""
        if lines:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(JobEvent), [{"job_id": j, "line": line, "at": now()} for j, line in lines]
                )

    def events(self, job_id: int, after: int = 0) -> list[JobEvent]:
        """The job's lines after the one of id `after`, oldest first."""
        q = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after).order_by(JobEvent.id)
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(q))

    def entry(self, job_id: int) -> QueuedJob | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(QueuedJob, job_id)

    # ---- pools -------------------------------------------------------------------------------------
    def register_pool(
        self, pool: str, workers: int, gpu_types: Mapping[str | None, int] | None = None
    ) -> None:
        """A pool starts serving: its policy (this queue's) and its workers per GPU type go in its row."""
        types = {"" if t is None else t: n for t, n in (gpu_types or {None: workers}).items()}
        served = {"policy": (self.policy or Policy()).to_dict(), "gpu_types": types}
        with Session(self.engine) as s, s.begin():
            s.add(Pool(id=pool, host=socket.gethostname(), workers=workers, policy=served))

    def current_policy(self) -> Policy:
        """This process's policy (a pool's), else the live pool's."""
        return self.policy if self.policy is not None else self.served().policy

    def served(self) -> Served:
        """What the queue is served by: this process's policy if it has one, else the live pool's seen
        last (none alive: the default); the GPU types of every live pool."""
        pools = sorted(self.alive_pools(), key=lambda p: p.seen_at)
        types: dict[str | None, int] = {}
        for p in pools:
            for t, n in ((p.policy or {}).get("gpu_types") or {}).items():
                types[t or None] = types.get(t or None, 0) + n
        policy = self.policy
        if policy is None:
            stored = next((p.policy for p in reversed(pools) if p.policy), None)
            policy = Policy.from_dict(stored["policy"]) if stored else Policy()
        return Served(policy, types)

    def beat(self, pool: str, load: Mapping[str, Any] | None = None) -> None:
        """The pool is alive; claims of pools gone quiet are voided (their trials are taken again).
        `load`: what its workers run now, per GPU type ({type: {"workers": n, "running": {owner: n}}}),
        kept in its row for `farm pool status`."""
        stale = now() - timedelta(seconds=POOL_STALE_S)
        with self.engine.begin() as conn:
            values: dict[str, Any] = {"seen_at": now()}
            if load is not None:
                row = conn.scalar(select(Pool.policy).where(Pool.id == pool)) or {}
                values["policy"] = {**row, "load": dict(load)}
            conn.execute(update(Pool).where(Pool.id == pool).values(**values))
            gone = select(Pool.id).where(Pool.seen_at < stale)
            conn.execute(delete(TrialClaim).where(TrialClaim.pool.in_(gone)))
            conn.execute(delete(Pool).where(Pool.seen_at < stale))

    def unregister_pool(self, pool: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(TrialClaim).where(TrialClaim.pool == pool))
            conn.execute(delete(Pool).where(Pool.id == pool))

    def alive_pools(self) -> list[Pool]:
        stale = now() - timedelta(seconds=POOL_STALE_S)
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(Pool).where(Pool.seen_at >= stale)))

    # ---- cancelling and finishing ------------------------------------------------------------------
    def cancel(self, job_id: int) -> str:
        """Cancel a queued or running job: it leaves the queue (a pool stops its running trials within a
        tick), its finished results stay. Returns the status it had."""
        with Session(self.engine) as s, s.begin():
            job = s.get(Job, job_id)
            if job is None:
                raise LookupError(job_id)
            before = job.status
            if before in WAITING:
                job.status, job.finished_at = "cancelled", now()
                job.message = f"cancelled ({s.scalar(_count(job_id, PENDING))} trials not run)"
                s.add(JobEvent(job_id=job_id, line=job.message))
        return before

    def cancelled(self, job_ids: set[int]) -> set[int]:
        """The cancelled jobs among `job_ids`."""
        return self.settle(job_ids, finish=False)[1]

    def finish(self, job_ids: set[int]) -> list[int]:
        """Mark the running jobs among `job_ids` that have no pending trial left completed, and drop the
        claims of finished trials. Returns the jobs finished now."""
        return self.settle(job_ids)[0]

    def settle(self, job_ids: set[int], *, finish: bool = True) -> tuple[list[int], set[int]]:
        """A pool's turn on its jobs, in one transaction: with `finish`, what `finish` does, and in any
        case which of them are cancelled, read by the statement that probes them for a pending trial
        (a turn that wrote results sent the two probes apart). Returns (jobs finished now, cancelled)."""
        done: list[int] = []
        if not job_ids and not finish:
            return done, set()
        with Session(self.engine) as s, s.begin():
            if finish:  # the claims of trials written since: each of the few claims' trial probed by id
                s.execute(delete(TrialClaim).where(claimed_status() != PENDING))
            if not job_ids:
                return done, set()
            # their status, and (finishing) whether a pending trial is left: one probe per job on
            # (job_id, status, seq)
            probe = [Job.id, Job.status] + ([_has_pending().label("pending")] if finish else [])
            rows = s.execute(select(*probe).where(Job.id.in_(sorted(job_ids)))).all()
            gone = {row[0] for row in rows if row[1] == "cancelled"}
            left = {row[0] for row in rows if finish and row[2]}
            for job_id in sorted(set(job_ids) - left) if finish else ():
                changed = s.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.status.in_(WAITING))
                    .values(status="completed", finished_at=now())
                ).rowcount
                if changed:
                    done.append(job_id)
                    s.add(JobEvent(job_id=job_id, line="completed"))  # with the status: one commit
        return done, gone

    # ---- what farm jobs list shows -----------------------------------------------------------------
    def lines(self, counted: Mapping[int, Mapping[str, int]] | None = None) -> list[QueueLine]:
        """Queued and running jobs in the order they are served, with progress, an ETA and, for a job
        that no free worker would take, why (a quota, a GPU type the pools lack). A fixed number of
        statements, whatever the number of jobs (the queue's state, their rows, their trial counts, the
        running jobs' pace); each job's trials counted once (`counted`: the counts `farm jobs list`'s
        table read, a job among them not counted again), for the plan and the progress both."""
        served = self.served()
        counts = TrialCounts(counted)
        plan = self.plan(served.policy, counts)
        types = list(served.gpu_types) or [None]
        places = _places(plan, types)
        states = {j.job_id: j for j in plan.jobs}
        with Session(self.engine, expire_on_commit=False) as s:
            rows = s.execute(
                select(Job, QueuedJob)
                .join(QueuedJob, QueuedJob.job_id == Job.id)
                .where(Job.status.in_(WAITING), Job.id.in_(list(states)))
                .options(defer(Job.spec))  # megabytes for a large grid, and not shown
            ).all()
            paces = progress(s, counts.of(s, list(states)), [j for j, st in states.items() if st.running])
        rows.sort(key=lambda r: (not states[r[0].id].running, places.get(r[0].id, len(places) + 1),
                                 -r[1].priority, r[1].submitted_at, r[0].id))  # fmt: skip
        out, place = [], 0
        for job, q in rows:
            state, pace = states[job.id], paces.get(job.id, Progress(0, 0, None))
            left, taken = state.queued + state.running, state.running
            if taken == 0:
                place += 1
            out.append(
                QueueLine(job, q.priority, q.owner, None if taken else place, pace.total, pace.total - left,
                          taken, pace.eta_s(left, taken), plan.reason(state, types), plan.project[q.owner])
            )  # fmt: skip
        return out


def _count(job_id: int, status: str):
    return select(func.count()).where(TrialRow.job_id == job_id, TrialRow.status == status)


def _has_pending():
    return exists().where(TrialRow.job_id == Job.id, TrialRow.status == PENDING)


def _counts_matter(policy: Policy) -> bool:
    """Whether the order needs each job's waiting trials counted: only for a queued-trials quota."""
    quotas = [policy.default_quota, *(o.quota for o in policy.owners.values())]
    quotas += [p.quota for p in policy.projects.values()]
    return any(q.queued is not None for q in quotas)


def _picks(plan: Plan, gpu_type: str | None, n: int) -> list[JobState]:
    """The jobs `n` free workers of `gpu_type` take, one after another (each counted before the next)."""
    out: list[JobState] = []
    while len(out) < n and (job := plan.pick(gpu_type)) is not None:
        out.append(job)
        plan.take(job)
    return out


PLACES_LIMIT = 10_000  # fairshare.Plan.places' own: the longest line simulated


def _places(plan: Plan, types: list[str | None]) -> dict[int, int]:
    """`plan.places(types)`, simulated only as far as it takes to place every job that can be placed
    (the line's first picks: the same places), not to its 10,000th trial on every `farm jobs list`: a
    line of as many picks as jobs waiting first, doubled while a job that may still be placed has none
    (one behind a larger job's trials, or held by a queued-trials quota a pick may release)."""
    placeable = {
        j.job_id
        for j in plan.jobs
        if j.queued > 0 and (j.job_id in plan.held or plan.reason(j, types) is None)
    }
    limit = max(1, len(placeable))
    while True:
        found = plan.places(types, limit=limit)
        if placeable <= set(found) or limit >= PLACES_LIMIT:
            return found
        limit = min(2 * limit, PLACES_LIMIT)
