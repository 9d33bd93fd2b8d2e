"""Placement across GPU types (jobs.queue.fairshare, issue 47): best fit as a pure function (a worker of
a type goes to a job that needs that type before one that runs anywhere, within the share tolerance),
the project step counted without owners that wait for another type, the target split checked against
every placement of small cases, preemption's patience; then through the store's queue (Queue.claim, on
SQLite and PostgreSQL) and over simulated days of the team (benchmarks.fairness_bench)."""

from __future__ import annotations

import itertools
import random

import pytest

from jobs.queue.fairshare import JobState, Plan, RunningTrial, fits, target_workers
from jobs.queue.policy import Policy

H200 = {"gpu_type": "H200"}


def job(i: int, owner: str, *, priority: int = 0, queued: int = 10, running: int = 0, **kw) -> JobState:
    return JobState(i, owner, priority, submitted_s=kw.pop("submitted_s", float(i)), queued=queued,
                    running=running, **kw)  # fmt: skip


def test_best_fit_a_worker_of_a_type_goes_to_the_job_that_needs_it_within_the_tolerance():
    """ana runs anywhere, bo needs an H200, equal shares. Tied (7 workers each), the order serves ana
    first; on an H200 best fit serves bo (8 of 15 workers: 53%, within 50% + 5 points), on an H100 ana.
    One worker more for bo (9 of 15: 60%) is past the tolerance: ana. best_fit 0: the plain order."""
    tied = [job(1, "ana", running=7), job(2, "bo", running=7, **H200)]
    assert Plan(tied, {}, Policy(), 100.0).pick("H200").owner == "bo"
    assert Plan(tied, {}, Policy(), 100.0).pick("H100").owner == "ana"
    assert Plan(tied, {}, Policy(best_fit=0), 100.0).pick("H200").owner == "ana"
    over = [job(1, "ana", running=6), job(2, "bo", running=8, **H200)]
    assert Plan(over, {}, Policy(), 100.0).pick("H200").owner == "ana"
    assert Plan(over, {}, Policy(best_fit=0.1), 100.0).pick("H200").owner == "bo"


def test_best_fit_never_crosses_a_priority_nor_an_aged_job_nor_an_untyped_worker():
    policy = Policy(max_wait=50.0)
    higher = [job(1, "ana", priority=5, running=7), job(2, "bo", running=0, **H200)]
    assert Plan(higher, {}, policy, 10.0).pick("H200").job_id == 1
    aged = [job(1, "ana", running=7, submitted_s=0.0), job(2, "bo", running=7, submitted_s=40.0, **H200)]
    assert Plan(aged, {}, policy, 60.0).pick("H200").job_id == 1  # ana's job waited 60 s > 50 s
    memory = [job(1, "ana", running=7), job(2, "bo", running=7, min_memory_gb=100.0)]
    assert Plan(memory, {}, policy, 10.0).pick("H200").job_id == 2  # 141 GB: a need of memory is a need
    assert Plan(memory, {}, policy, 10.0).pick(None).job_id == 1  # untyped: nothing needs it more


def test_best_fit_picks_the_owner_then_its_jobs_share_its_workers_job_by_job():
    """bo's H200 job holds 4, his job that runs anywhere none: best fit chose bo for the H200, and inside
    bo the job holding fewest takes it (an owner's jobs share its workers job by job, as always)."""
    jobs = [job(1, "ana", running=7), job(2, "bo", running=4, **H200), job(3, "bo", running=3)]
    assert Plan(jobs, {}, Policy(), 100.0).pick("H200").job_id == 3


def test_a_project_is_counted_without_its_owners_that_wait_for_another_type():
    """Projects kernels (ana, runs anywhere; bo, needs an H200) and research (dee), equal weights. bo
    waits for an H200: on an H100 kernels' claim is ana's alone, 3 / 0.25 against research's 5 / 0.5:
    dee. With bo not waiting (only running), kernels counts him: (3 + 1 + 1) / 0.5 < dee's: ana."""
    policy = Policy.from_dict(
        {"projects": {"kernels": {"owners": ["ana", "bo"]}, "research": {"owners": ["dee"]}}}
    )
    jobs = [job(1, "ana", running=2), job(2, "bo", running=1, **H200), job(3, "dee", running=4)]
    assert Plan(jobs, {}, policy, 0.0).pick("H100").owner == "dee"
    idle_bo = [jobs[0], job(2, "bo", queued=0, running=1, **H200), jobs[2]]
    assert Plan(idle_bo, {}, policy, 0.0).pick("H100").owner == "ana"


def _owner_vectors(jobs: list[JobState], room: dict[str, int], policy: Policy) -> set[tuple[int, ...]]:
    """Every vector of workers per owner that some placement of workers on jobs gives (each worker on a
    job it fits or idle, no job over its trials): by enumeration, the oracle for target_workers."""
    owners = sorted({j.owner for j in jobs})
    slots = [t for t, n in room.items() for _ in range(n)]
    choices = [[None] + [k for k, j in enumerate(jobs) if fits(j, t, policy)] for t in slots]
    out = set()
    for pick in itertools.product(*choices):
        per_job = [pick.count(k) for k in range(len(jobs))]
        if all(n <= j.queued + j.running for n, j in zip(per_job, jobs, strict=True)):
            out.add(tuple(sum(n for n, j in zip(per_job, jobs, strict=True) if j.owner == o) for o in owners))
    return out


def test_target_workers_is_the_max_min_fair_split_of_what_the_jobs_can_use():
    """Random small clusters of H100s and H200s and owners whose jobs need an H200, 100 GB or nothing:
    the split is a placement that exists, uses as many workers as any placement can, and no worker can
    move from one owner to another that would then be further below its target than the first was."""
    rng = random.Random(47)
    kinds = ({}, H200, {"min_memory_gb": 100.0}, {"gpu_type": "H100"})
    for _ in range(120):
        policy = Policy.from_dict({"owners": {o: {"weight": rng.choice([1, 2, 3])} for o in "abc"}})
        jobs = [job(k, rng.choice("abc"), queued=rng.randint(0, 4), **rng.choice(kinds)) for k in range(4)]
        room = {"H100": rng.randint(0, 3), "H200": rng.randint(0, 3)}
        plan = Plan(jobs, {}, policy, 0.0)
        got = target_workers(plan, room)
        owners = sorted({j.owner for j in jobs})
        vectors = _owner_vectors(jobs, room, policy)
        held = tuple(int(got.get(o, 0.0)) for o in owners)
        assert held in vectors, (jobs, room, got)
        assert sum(held) == max(map(sum, vectors)), (jobs, room, got)
        for a, b in itertools.permutations(range(len(owners)), 2):
            moved = tuple(h + (i == a) - (i == b) for i, h in enumerate(held))
            if moved in vectors:
                ta, tb = plan.targets[owners[a]], plan.targets[owners[b]]
                assert (held[a] + 1) / ta >= held[b] / tb - 1e-9, (jobs, room, got, owners[a], owners[b])


def test_preemption_waits_patience_for_a_worker_to_free_first():
    """CI (priority 10) waits with every worker busy: no trial is stopped until CI has waited `patience`
    (a busy pool frees a worker within seconds; a stopped trial has lost at least min_run)."""
    policy = Policy.from_dict({"preempt": {"enabled": True, "min_run": 0, "patience": "20s"}})
    low, running = job(1, "ana", running=1), [RunningTrial(11, 1, None, started_s=0.0)]
    ci = job(2, "ci", priority=10, submitted_s=100.0)
    assert Plan([low, ci], {}, policy, 119.0).pick_victim(running, None) is None
    assert Plan([low, ci], {}, policy, 120.0).pick_victim(running, None).trial_id == 11


# ---- at the pool level ----------------------------------------------------------------------------------
SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""


def test_the_queue_claims_an_h200_for_the_job_that_needs_it(store_url):
    """Through the store (Queue.claim, what a pool's free worker asks): ana's job runs anywhere, bo's
    needs an H200. Two H100s and two H200s taken, then a third H200 frees with ana and bo at 2 workers
    each: the plain order serves ana (tied, by name); best fit (tolerance 20 points here: 3 of 5 is 60%)
    serves bo."""
    from jobs.queue.queue import Queue
    from jobs.spec.sweep import loads_spec
    from jobs.store import Store

    store = Store(store_url)
    loose = Policy(best_fit=0.2)
    ana = Queue(store).submit(loads_spec(SPEC.format(name="ana", grid=list(range(8)))), owner="ana")
    bo_spec = SPEC.format(name="bo", grid=list(range(8))) + "gpu: {type: H200}\n"
    bo = Queue(store).submit(loads_spec(bo_spec), owner="bo")
    taken = [Queue(store, loose).claim("p", t).job.id for t in ("H100", "H100", "H200", "H200")]
    assert taken == [ana, ana, bo, bo]
    assert Queue(store, Policy(best_fit=0)).plan().pick("H200").job_id == ana
    assert Queue(store, loose).claim("p", "H200").job.id == bo
    store.close()


@pytest.mark.parametrize("seed", [11])
def test_a_simulated_day_keeps_shares_with_best_fit_and_misses_without(seed):
    """Days of the team (benchmarks.fairness_bench) where jobs that run anywhere, without best fit, held
    H200s while H200-only jobs waited: an owner more than 5 points off its target in some hour. With best
    fit every owner is within 5 points in every hour it has work."""
    from benchmarks.fairness_bench import POLICY, WORKERS, Day, figures, team_day

    def worst(best_fit: float) -> float:
        policy = Policy.from_dict(POLICY | {"best_fit": best_fit})
        fig = figures(Day(team_day(seed, 24), policy, WORKERS, 24).run(), policy)
        return max(o["worst_gap_pts"] for o in fig["owners"].values())

    assert worst(0.0) > 5.0
    assert worst(0.05) <= 5.0


def test_a_job_past_max_wait_stops_another_owners_trial_of_its_priority():
    """bo's job has waited max_wait with every worker busy with ana's (ana within her share): with
    preemption on, the pool stops one of ana's trials then, so nothing waits longer than max_wait for a
    worker; a minute earlier, nothing is stopped."""
    policy = Policy.from_dict({"max_wait": "1h", "preempt": {"enabled": True, "min_run": "2m"}})
    ana = job(1, "ana", running=1, queued=5, submitted_s=0.0, last_taken_s=3000.0)
    running = [RunningTrial(11, 1, None, started_s=3000.0)]
    bo = job(2, "bo", submitted_s=100.0)
    assert Plan([ana, bo], {}, policy, 3640.0).pick_victim(running, None) is None
    assert Plan([ana, bo], {}, policy, 3700.0).pick_victim(running, None).trial_id == 11
