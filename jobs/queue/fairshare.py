"""Who gets the next free worker: a pure function of the queue's state, shared by the pool (through
jobs.queue.queue), `farm jobs list`, `farm pool status` and the fairness benchmark's simulation.

Inputs: every queued or running job (`JobState`: owner, priority, trials waiting and running, when it
last got a worker, the GPU it needs), each owner's past usage in worker-seconds already decayed to now
(`decayed`), and the pool's `Policy` (jobs.queue.policy). Nothing here reads a clock, the store or Ray.

Order, for a worker of GPU type T (None: an untyped cluster):
1. Only jobs with a trial waiting that fits T (type and memory), within their owner's and project's
   worker quota and not held by a queued-trials quota.
2. A job that has waited `max_wait` since it last got a worker (or was submitted) goes first, the longest
   waiting first: nothing waits forever.
3. Otherwise the highest priority goes first (a CI job at 10 takes the next free worker).
4. Among equal priorities, the project, then inside it the owner, furthest below its target share:
   the smallest (workers it holds + 1) / target; a project counted without its owners whose waiting
   trials this worker does not take now (another GPU type, a lower priority, a quota): their unmet share
   is no claim of the others on this worker. Targets follow the weights, lowered by past use (Slurm's
   classic fair-share factor 2^(-usage share / weight share), at each level): yesterday's heavy user
   yields to today's light one, and under steady contention usage, and so shares, converge to the weights.
5. Inside an owner, its jobs share its workers job by job: the job holding fewest workers, then the one
   that has waited longest, then the lower id.
6. Best fit, on a worker of a GPU type: when steps 4-5 chose a job that runs anywhere, the job steps 4-5
   would choose among those of the same priority that need this worker (a GPU type or memory it has)
   takes it instead, provided its owner, with this worker, holds at most its target share plus the
   policy's `best_fit` (5 points by default). The job that runs anywhere takes the next worker of another
   type; without this, jobs that run anywhere fill the scarce type while the jobs that need it wait, and
   their owners fall below their share (issue 47). Never across priorities, never before an aged job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from jobs.queue.policy import Policy


@dataclass(frozen=True)
class JobState:
    job_id: int
    owner: str
    priority: int
    submitted_s: float  # on the caller's clock (epoch seconds, or a simulation's)
    queued: int  # trials waiting that no worker has taken
    running: int = 0  # trials taken and not yet written
    last_taken_s: float | None = None  # when it last got a worker
    project: str | None = None  # as submitted; the policy's mapping of the owner wins
    gpu_type: str | None = None  # the GPU type it needs (None: any)
    min_memory_gb: float | None = None

    def waited(self, now_s: float) -> float:
        since = self.submitted_s if self.last_taken_s is None else max(self.last_taken_s, self.submitted_s)
        return max(0.0, now_s - since)


@dataclass(frozen=True)
class RunningTrial:
    """A trial on a worker now, as preemption sees it."""

    trial_id: int
    job_id: int
    gpu_type: str | None
    started_s: float
    preempted_s: float | None = None  # when it was last preempted (None: never)


def decayed(usage_s: float, age_s: float, half_life_s: float) -> float:
    """Worker-seconds of usage recorded `age_s` ago, as they count now."""
    return usage_s * math.pow(0.5, max(0.0, age_s) / half_life_s)


def fits(job: JobState, gpu_type: str | None, policy: Policy) -> bool:
    """Whether a worker of `gpu_type` can run the job's trials."""
    if job.gpu_type is not None and job.gpu_type != gpu_type:
        return False
    if job.min_memory_gb is not None:
        memory = policy.memory_gb(gpu_type)
        return memory is not None and memory >= job.min_memory_gb
    return True


def bound(job: JobState) -> bool:
    """Whether the job names the GPU it needs (a type or a memory): it runs on some workers only."""
    return job.gpu_type is not None or job.min_memory_gb is not None


def project_of(job: JobState, policy: Policy) -> str:
    return policy.project_of(job.owner) or job.project or job.owner


@dataclass
class Plan:
    """The queue's state with everything the order needs computed once: who holds how many workers,
    each owner's and project's target share, and the jobs held (with their reason)."""

    jobs: list[JobState]
    usage: Mapping[str, float]
    policy: Policy
    now_s: float
    targets: dict[str, float] = field(default_factory=dict)  # owner -> share of all workers
    project_targets: dict[str, float] = field(default_factory=dict)
    held: dict[int, str] = field(default_factory=dict)  # job -> why it waits whatever worker is free

    def __post_init__(self) -> None:
        self.project = {j.owner: project_of(j, self.policy) for j in self.jobs}
        self.project_targets, self.targets = _targets(self.jobs, self.project, self.usage, self.policy)
        self.held = _queued_quota(self.jobs, self.project, self.policy)

    # ---- counts -----------------------------------------------------------------------------------
    def running_owner(self, owner: str) -> int:
        return sum(j.running for j in self.jobs if j.owner == owner)

    def running_project(self, project: str) -> int:
        return sum(j.running for j in self.jobs if self.project[j.owner] == project)

    # ---- the order ----------------------------------------------------------------------------------
    def blocked(self, job: JobState, gpu_type: str | None) -> str | None:
        """Why a worker of `gpu_type` does not take this job now, or None when it may."""
        if job.queued <= 0:
            return "nothing waiting"
        if job.job_id in self.held:
            return self.held[job.job_id]
        if not fits(job, gpu_type, self.policy):
            return _gpu_words(job)
        quota = self.policy.owner_quota(job.owner).workers
        if quota is not None and self.running_owner(job.owner) >= quota:
            return f"owner {job.owner} holds {self.running_owner(job.owner)} workers, its quota"
        project = self.project[job.owner]
        quota = self.policy.project_quota(project).workers
        if quota is not None and self.running_project(project) >= quota:
            return f"project {project} holds {self.running_project(project)} workers, its quota"
        return None

    def pick(self, gpu_type: str | None = None) -> JobState | None:
        """The job whose trial a free worker of `gpu_type` takes now, or None."""
        ready = [j for j in self.jobs if self.blocked(j, gpu_type) is None]
        if not ready:
            return None
        aged = [j for j in ready if j.waited(self.now_s) >= self.policy.max_wait]
        if aged:
            return min(aged, key=lambda j: (-j.waited(self.now_s), j.job_id))
        top = max(j.priority for j in ready)
        ready = [j for j in ready if j.priority == top]
        away = self._elsewhere(ready)
        chosen = self._fair(ready, away)
        if gpu_type is None or bound(chosen) or self.policy.best_fit <= 0:
            return chosen
        needing = {j.owner for j in ready if bound(j)}
        better = self._fair([j for j in ready if j.owner in needing], away) if needing else None
        return better if better is not None and self._may_exceed(better.owner) else chosen

    def _elsewhere(self, ready: Sequence[JobState]) -> frozenset[str]:
        """Owners with trials waiting, none of which this worker takes now (another GPU type, a lower
        priority, a quota): what they hold and their target are not their project's claim on it."""
        here = {j.owner for j in ready}
        return frozenset(j.owner for j in self.jobs if j.queued > 0 and j.owner not in here)

    def _fair(self, ready: Sequence[JobState], away: frozenset[str] = frozenset()) -> JobState:
        """Steps 4 and 5 of the order among `ready` (jobs of one priority)."""
        project = min({self.project[j.owner] for j in ready}, key=lambda p: self._project_need(p, away))
        owner = min({j.owner for j in ready if self.project[j.owner] == project}, key=self._owner_need)
        mine = [j for j in ready if j.owner == owner]
        return min(mine, key=lambda j: (j.running, -j.waited(self.now_s), j.job_id))

    def _may_exceed(self, owner: str) -> bool:
        """Best fit (step 6): whether the owner, given one more worker, stays within `best_fit` of its
        target share. The workers counted: those running now and this one (a busy pool, where placement
        matters; with workers idle the estimate is smaller and best fit more careful)."""
        workers = sum(j.running for j in self.jobs) + 1
        share = (self.running_owner(owner) + 1) / workers
        return share <= self.targets.get(owner, 0.0) + self.policy.best_fit

    def _project_need(self, project: str, away: frozenset[str] = frozenset()) -> tuple[float, float, str]:
        """(held + 1) / target of the project, without its owners `away` (their workers and targets)."""
        gone = {o for o in away if self.project.get(o) == project}
        target = self.project_targets.get(project, 0.0) - sum(self.targets.get(o, 0.0) for o in gone)
        held = self.running_project(project) - sum(self.running_owner(o) for o in gone)
        return (held + 1) / (target if target > 1e-12 else 1e-12), self._usage_of(project), project

    def _owner_need(self, owner: str) -> tuple[float, float, str]:
        target = self.targets.get(owner, 0.0) or 1e-12
        return (self.running_owner(owner) + 1) / target, self.usage.get(owner, 0.0), owner

    def _usage_of(self, project: str) -> float:
        return sum(u for o, u in self.usage.items() if self.project.get(o, o) == project)

    def take(self, job: JobState) -> None:
        """Count one more trial of `job` as running (what the order looks like after this grant)."""
        i = next(i for i, j in enumerate(self.jobs) if j.job_id == job.job_id)
        self.jobs[i] = replace(job, queued=job.queued - 1, running=job.running + 1, last_taken_s=self.now_s)
        self.held = _queued_quota(self.jobs, self.project, self.policy)

    def places(self, gpu_types: Sequence[str | None] = (None,), limit: int = 10_000) -> dict[int, int]:
        """Each job's place in the line (1: served first): the order in which free workers, of the given
        types in turn, would first take one of its trials."""
        trial = Plan(list(self.jobs), self.usage, self.policy, self.now_s)
        out: dict[int, int] = {}
        for n in range(limit):
            job = next((j for t in _rotate(gpu_types, n) if (j := trial.pick(t)) is not None), None)
            if job is None:
                break
            out.setdefault(job.job_id, len(out) + 1)
            trial.take(job)
        return out

    def reason(self, job: JobState, gpu_types: Iterable[str | None]) -> str | None:
        """Why the job waits whatever worker is free (held, over quota, no GPU of its type), or None."""
        why = [self.blocked(job, t) for t in gpu_types]
        return None if any(w is None for w in why) or not why else why[0]

    def pick_victim(
        self, running: Sequence[RunningTrial], gpu_type: str | None, gpu_types: Sequence[str | None] = ()
    ) -> RunningTrial | None:
        """A running trial on a worker of `gpu_type` that the job next in line for that type has more
        right to (jobs.queue.policy.Preemption): for a job past `max_wait` any other owner's, else of a
        lower-priority job, or of an owner further over its target than the waiting one would be with
        that worker; past `min_run`, not stopped within
        `again_after`; never one whose job can run on fewer of the pool's `gpu_types` than the waiting
        one (a trial that needs this type does not yield to one that could run elsewhere). The one that
        ran least (least work lost). None while the waiting job has waited less than `patience` (a worker
        of a busy pool frees within seconds; a stopped trial has lost at least `min_run`)."""
        rule = self.policy.preempt
        waiting = self.pick(gpu_type)
        if not rule.enabled or waiting is None or waiting.waited(self.now_s) < rule.patience:
            return None
        by_id = {j.job_id: j for j in self.jobs}
        aged = waiting.waited(self.now_s) >= self.policy.max_wait
        need = self._owner_need(waiting.owner)[0]

        def room(job: JobState) -> int:
            return sum(fits(job, t, self.policy) for t in gpu_types)

        def yields(t: RunningTrial) -> bool:
            job = by_id.get(t.job_id)
            if job is None or t.gpu_type != gpu_type or job.owner == waiting.owner:
                return False
            if room(job) < room(waiting):
                return False
            if self.now_s - t.started_s < rule.min_run:
                return False
            if t.preempted_s is not None and self.now_s - t.preempted_s < rule.again_after:
                return False
            if aged or job.priority != waiting.priority:
                return job.priority < waiting.priority or aged
            return self.running_owner(job.owner) / (self.targets.get(job.owner) or 1e-12) > need

        victims = [t for t in running if yields(t)]
        return max(victims, key=lambda t: (t.started_s, t.trial_id), default=None)


def _rotate(items: Sequence[str | None], n: int) -> list[str | None]:
    k = n % len(items)
    return list(items[k:]) + list(items[:k])


def _gpu_words(job: JobState) -> str:
    parts = [job.gpu_type] if job.gpu_type else []
    if job.min_memory_gb is not None:
        parts.append(f">= {job.min_memory_gb:g} GB")
    return f"needs a GPU {' '.join(parts)}"


def _factor(usage: float, usage_total: float, weight: float, weight_total: float) -> float:
    """Slurm's classic fair-share factor: 1 with no past use, 0.5 at exactly the weight's share."""
    if usage_total <= 0:
        return 1.0
    return math.pow(2.0, -(usage / usage_total) / (weight / weight_total))


def _targets(
    jobs: Sequence[JobState], project: Mapping[str, str], usage: Mapping[str, float], policy: Policy
) -> tuple[dict[str, float], dict[str, float]]:
    """Target shares of all workers for the projects and owners with work (waiting or running)."""
    active: dict[str, set[str]] = defaultdict(set)
    for j in jobs:
        if j.queued > 0 or j.running > 0:
            active[project[j.owner]].add(j.owner)
    if not active:
        return {}, {}
    some_owner = {p: min(owners) for p, owners in active.items()}
    p_weight = {p: policy.project_weight(p, some_owner[p]) for p in active}
    p_usage = {p: sum(usage.get(o, 0.0) for o in owners) for p, owners in active.items()}
    p_targets = _level(p_weight, p_usage, 1.0)
    targets: dict[str, float] = {}
    for p, owners in active.items():
        weights = {o: policy.weight(o) for o in owners}
        targets |= _level(weights, {o: usage.get(o, 0.0) for o in owners}, p_targets[p])
    return p_targets, targets


def _level(weights: Mapping[str, float], usage: Mapping[str, float], share: float) -> dict[str, float]:
    """`share` split among one level's members by weight times fair-share factor."""
    w_total, u_total = sum(weights.values()), sum(usage.values())
    effective = {k: w * _factor(usage[k], u_total, w, w_total) for k, w in weights.items()}
    e_total = sum(effective.values())
    return {k: share * e / e_total for k, e in effective.items()}


def _queued_quota(jobs: Sequence[JobState], project: Mapping[str, str], policy: Policy) -> dict[int, str]:
    """Jobs held by a queued-trials quota: in the order they were submitted, an owner's (and a project's)
    jobs are let in while their waiting trials stay within the quota; the first is always let in (a job
    larger than the quota runs alone, never refused)."""
    held: dict[int, str] = {}
    waiting: dict[tuple[str, str], int] = defaultdict(int)
    for j in sorted(jobs, key=lambda j: (j.submitted_s, j.job_id)):
        if j.queued <= 0:
            continue
        for kind, name, limit in (
            ("owner", j.owner, policy.owner_quota(j.owner).queued),
            ("project", project[j.owner], policy.project_quota(project[j.owner]).queued),
        ):
            ahead = waiting[(kind, name)]
            if limit is not None and ahead and ahead + j.queued > limit and j.job_id not in held:
                held[j.job_id] = f"{kind} {name} has {ahead} trials queued ahead of it, quota {limit}"
        if j.job_id not in held:
            waiting[("owner", j.owner)] += j.queued
            waiting[("project", project[j.owner])] += j.queued
    return held


def target_workers(plan: Plan, workers: int | Mapping[str | None, int]) -> dict[str, float]:
    """Workers each owner should hold now, as the policy means it: whole workers handed out one at a
    time, the highest priority with work first, then the owner furthest below its target share
    ((held + 1) / target), each owner never given more than its jobs can use (trials waiting + running)
    nor a worker of a GPU type its jobs cannot run on. Where the workers sit is free to change as they
    are handed out (an augmenting path, _Placement): a job that runs anywhere moves to another type so
    that one that needs this type can have it. The result is the max-min fair split (by target share)
    of what the jobs can use. `workers`: a count (untyped) or per GPU type."""
    room = dict(workers) if isinstance(workers, Mapping) else {None: workers}
    placing = _Placement(room)
    for j in plan.jobs:
        if j.queued + j.running > 0:
            placing.want(
                (j.owner, j.priority), tuple(t for t in room if fits(j, t, plan.policy)), j.queued + j.running
            )
    held: dict[str, float] = {o: 0.0 for o in plan.targets}
    for tier in sorted({p for _, p in placing.owners}, reverse=True):
        open_ = {o for o, p in placing.owners if p == tier}
        while open_:
            owner = min(open_, key=lambda o: ((held.get(o, 0.0) + 1) / (plan.targets.get(o) or 1e-12), o))
            if placing.add((owner, tier)):
                held[owner] = held.get(owner, 0.0) + 1.0
            else:
                open_.discard(owner)
    return held


_START = object()


@dataclass(frozen=True)
class _Hand:
    """A group reached through its owner: `group` (reached through a type) hands it its place."""

    group: tuple


class _Placement:
    """Workers placed on groups of jobs (one owner's, at one priority, that run on the same GPU types),
    each group at most its demand, each type at most its workers: a transportation problem grown one
    worker at a time by augmenting paths (a group takes a type with room, or a type where another group
    can move one of its workers to a type it also runs on, and so on)."""

    def __init__(self, room: Mapping[str | None, int]) -> None:
        self.room = dict(room)  # workers not placed, per type
        self.demand: dict[tuple[tuple[str, int], tuple], int] = defaultdict(int)
        self.flow: dict[tuple[tuple[str, int], tuple], dict[str | None, int]] = {}
        self.owners: set[tuple[str, int]] = set()

    def want(self, who: tuple[str, int], types: tuple, n: int) -> None:
        if types:
            self.demand[(who, types)] += n
            self.flow.setdefault((who, types), dict.fromkeys(types, 0))
            self.owners.add(who)

    def add(self, who: tuple[str, int]) -> bool:
        """Place one more worker for `who`; False when no placement can. A breadth-first search for an
        augmenting path: a group reached through a type gives up its worker of that type and either
        takes one of another type it runs on or hands its place to a group of the same owner."""
        via: dict[tuple, object] = {g: _START for g in self.flow if g[0] == who and self._spare(g)}
        by: dict[str | None, tuple] = {}  # type -> the group that takes a worker of it
        frontier = list(via)
        while frontier:
            reached = []
            for group in frontier:
                if via[group] is not _START and not isinstance(via[group], _Hand):
                    for sibling in self.flow:  # its owner's other jobs take its place
                        if sibling[0] == group[0] and sibling not in via and self._spare(sibling):
                            via[sibling] = _Hand(group)
                            reached.append(sibling)
                for t in group[1]:
                    if t in by:
                        continue
                    by[t] = group
                    if self.room[t] > 0:
                        self._shift(t, by, via)
                        return True
                    for other, f in self.flow.items():
                        if f.get(t, 0) > 0 and other not in via:
                            via[other] = t
                            reached.append(other)
            frontier = reached
        return False

    def _spare(self, group: tuple) -> bool:
        return sum(self.flow[group].values()) < self.demand[group]

    def _shift(self, t: str | None, by: Mapping[str | None, tuple], via: Mapping[tuple, object]) -> None:
        """Walk the path back from type `t` (which has room): each group on it takes a worker of the type
        it reached, and gives up one of the type it was reached through (itself or, handed on, the
        group of its owner that reached it)."""
        self.room[t] -= 1
        while True:
            group = by[t]
            self.flow[group][t] += 1
            back = via[group]
            if back is _START:
                return
            if isinstance(back, _Hand):
                group, back = back.group, via[back.group]
            t = back  # type: ignore[assignment]
            self.flow[group][t] -= 1
