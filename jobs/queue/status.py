"""What `farm pool status` and the pool's Prometheus metrics show: per owner, the workers it holds (in all
and per GPU type), its share of the workers against its target, the workers its target gives it now
(water-filled by what it can use), its decayed usage and its quota use; per pool, its workers per GPU type.

Read from the store: the queue's state (jobs.queue.queue.Queue.plan), the live pools' rows (their policy,
GPU types and what each of their workers runs, written at every beat) and the preemptions kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.queue.fairshare import Plan, target_workers
from jobs.queue.queue import Queue


@dataclass(frozen=True)
class OwnerRow:
    owner: str
    project: str
    running: int
    by_type: dict[str, int]  # GPU type ("untyped" for none) -> workers it holds there
    share: float  # of all the live pools' workers
    target: float  # its target share (weights and past usage)
    target_workers: float  # what the target gives it now, given what each owner can use
    usage_s: float  # past usage, worker-seconds decayed to now
    queued: int  # trials waiting
    worker_quota: int | None
    queued_quota: int | None


@dataclass(frozen=True)
class PoolRow:
    pool: str
    host: str
    gpu_types: dict[str, int]
    busy: dict[str, int]


@dataclass
class Status:
    plan: Plan
    owners: list[OwnerRow] = field(default_factory=list)
    pools: list[PoolRow] = field(default_factory=list)
    workers: int = 0
    preemptions: int = 0
    preempted_s: float = 0.0


def status(queue: Queue) -> Status:
    """The queue's and the live pools' state now."""
    served = queue.served()
    plan = queue.plan(served.policy)
    pools, by_owner_type = [], {}
    for p in queue.alive_pools():
        row = p.policy or {}
        load = row.get("load") or {}
        busy = {t or "untyped": sum((v.get("running") or {}).values()) for t, v in load.items()}
        pools.append(
            PoolRow(p.id, p.host, {t or "untyped": n for t, n in (row.get("gpu_types") or {}).items()}, busy)
        )
        for t, v in load.items():
            for owner, n in (v.get("running") or {}).items():
                per = by_owner_type.setdefault(owner, {})
                per[t or "untyped"] = per.get(t or "untyped", 0) + n
    workers = sum(served.gpu_types.values())
    fair = target_workers(plan, served.gpu_types) if workers else {}
    out = Status(plan, pools=pools, workers=workers)
    owners = sorted(set(plan.targets) | set(plan.usage))
    for owner in owners:
        running = plan.running_owner(owner)
        quota = served.policy.owner_quota(owner)
        out.owners.append(
            OwnerRow(
                owner,
                plan.project.get(owner, served.policy.project_of(owner) or owner),
                running,
                by_owner_type.get(owner, {}),
                running / workers if workers else 0.0,
                plan.targets.get(owner, 0.0),
                fair.get(owner, 0.0),
                plan.usage.get(owner, 0.0),
                sum(j.queued for j in plan.jobs if j.owner == owner),
                quota.workers,
                quota.queued,
            )  # fmt: skip
        )
    out.preemptions, out.preempted_s = queue.preemptions()
    return out
