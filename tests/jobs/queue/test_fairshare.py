"""The order of the queue as a pure function (jobs.queue.fairshare): checked exhaustively over small
states and by simulation on a virtual clock, without Ray or a store."""

from __future__ import annotations

import itertools
import random

import pytest

from jobs.queue.fairshare import JobState, Plan, RunningTrial, decayed, target_workers
from jobs.queue.policy import Policy

HOUR = 3600.0


def job(i: int, owner: str, *, priority: int = 0, queued: int = 10, running: int = 0, **kw) -> JobState:
    return JobState(i, owner, priority, submitted_s=kw.pop("submitted_s", float(i)), queued=queued,
                    running=running, **kw)  # fmt: skip


def simulate(jobs: list[JobState], policy: Policy, workers: int, grants: int, usage=None) -> list[int]:
    """Workers free one at a time, each trial as long as the others: the job of each grant, in order."""
    plan = Plan(list(jobs), dict(usage or {}), policy, now_s=100.0)
    order, running = [], []
    for _ in range(grants):
        plan.now_s += 1.0  # a trial's time
        if len(running) >= workers:  # the oldest trial ends
            done = running.pop(0)
            i = next(k for k, j in enumerate(plan.jobs) if j.job_id == done)
            plan.jobs[i] = JobState(**{**plan.jobs[i].__dict__, "running": plan.jobs[i].running - 1})
        picked = plan.pick()
        if picked is None:
            break
        plan.take(picked)
        order.append(picked.job_id)
        running.append(picked.job_id)
    return order


def test_the_seen_case_the_second_owner_shares_from_the_first_trials():
    """Issue 47's case: owner a has jobs 1-4, owner b job 5, all priority 0, 2 workers."""
    jobs = [job(i, "a", queued=12) for i in range(1, 5)] + [job(5, "b", queued=12)]
    order = simulate(jobs, Policy(), workers=2, grants=30)
    assert 5 in order[:2]
    assert order[:24].count(5) == 12  # half the workers for b until its 12 trials ran, half for a
    a = [j for j in order if j != 5]
    counts = [a.count(j) for j in (1, 2, 3, 4)]
    assert a[:4] == [1, 2, 3, 4] and max(counts) - min(counts) <= 1, a  # job by job


def test_exhaustively_the_pick_is_the_owner_furthest_below_its_target():
    """Every combination of workers held by three owners of weights 1, 2, 3 (0..4 each), with and without
    past usage: the owner picked has the smallest (held + 1) / target, and its job holding fewest."""
    policy = Policy.from_dict({"owners": {"a": {"weight": 1}, "b": {"weight": 2}, "c": {"weight": 3}}})
    for held in itertools.product(range(5), repeat=3):
        for usage in ({}, {"a": 0.0, "b": 50.0, "c": 500.0}):
            jobs = []
            for k, (owner, n) in enumerate(zip("abc", held, strict=True)):
                jobs += [job(10 * k + 1, owner, running=n // 2), job(10 * k + 2, owner, running=n - n // 2)]
            plan = Plan(jobs, usage, policy, now_s=100.0)
            picked = plan.pick()
            need = {o: (held[i] + 1) / plan.targets[o] for i, o in enumerate("abc")}
            assert need[picked.owner] == min(need.values()), (held, usage, picked)
            mine = [j for j in jobs if j.owner == picked.owner]
            assert picked.running == min(j.running for j in mine)


def test_targets_follow_weights_and_yesterdays_heavy_user_yields():
    policy = Policy.from_dict({"owners": {"a": {"weight": 3}}})
    jobs = [job(1, "a"), job(2, "b")]
    assert Plan(jobs, {}, policy, 0.0).targets == pytest.approx({"a": 0.75, "b": 0.25})
    equal = Plan(jobs, {"a": 1e5, "b": 0.0}, Policy(), 0.0).targets
    assert equal["b"] > 0.75 and equal["a"] < 0.25  # a had it all: b gets most, a is not starved
    assert equal["a"] > 0.0
    # one half-life later yesterday's use counts half; after many it is forgotten
    assert decayed(100.0, 86_400.0, 86_400.0) == pytest.approx(50.0)
    assert decayed(100.0, 0.0, 86_400.0) == 100.0


def test_projects_split_first_then_owners_inside():
    policy = Policy.from_dict({"projects": {"kern": {"weight": 1, "owners": ["a", "b", "c"]},
                                            "serve": {"weight": 1, "owners": ["d"]}}})  # fmt: skip
    jobs = [job(i, o) for i, o in enumerate("abcd", 1)]
    plan = Plan(jobs, {}, policy, 0.0)
    assert plan.project_targets == pytest.approx({"kern": 0.5, "serve": 0.5})
    assert plan.targets == pytest.approx({"a": 1 / 6, "b": 1 / 6, "c": 1 / 6, "d": 0.5})
    order = simulate(jobs, policy, workers=6, grants=6)
    assert order.count(4) == 3  # d alone holds its project's half


def test_priority_first_and_a_job_waiting_past_max_wait_goes_before_it():
    policy = Policy.from_dict({"max_wait": "30m"})
    ci = job(3, "ci", priority=10, submitted_s=99.0)
    jobs = [job(1, "a", running=3), job(2, "b"), ci]
    assert Plan(jobs, {}, policy, 100.0).pick() == ci  # b holds nothing, but CI is at priority 10
    old = job(2, "b", submitted_s=100.0 - 1800.0)
    assert Plan([jobs[0], old, ci], {}, policy, 100.0).pick() == old  # aged: before any priority
    # its wait counts from the last time it got a worker
    served = job(2, "b", submitted_s=100.0 - 1800.0, last_taken_s=90.0)
    assert Plan([jobs[0], served, ci], {}, policy, 100.0).pick() == ci


def test_worker_quotas_hold_an_owner_and_a_project_with_the_reason():
    project = {"owners": ["b", "c"], "quota": {"workers": 1}}
    policy = Policy.from_dict({"owners": {"a": {"quota": {"workers": 2}}}, "projects": {"p": project}})
    jobs = [job(1, "a", running=2), job(2, "b", running=1), job(3, "c")]
    plan = Plan(jobs, {}, policy, 0.0)
    assert plan.pick() is None
    assert plan.reason(jobs[0], [None]) == "owner a holds 2 workers, its quota"
    assert plan.reason(jobs[2], [None]) == "project p holds 1 workers, its quota"


def test_a_queued_trials_quota_holds_later_jobs_never_the_first():
    policy = Policy.from_dict({"default_quota": {"queued": 15}})
    jobs = [job(1, "a", queued=20), job(2, "a", queued=5), job(3, "b", queued=5)]
    plan = Plan(jobs, {}, policy, 0.0)
    assert plan.held == {2: "owner a has 20 trials queued ahead of it, quota 15"}
    places = plan.places()  # job 2 waits whatever is free (never an error) until job 1 has drained
    assert places[1] < places[3] < places[2] and plan.reason(jobs[1], [None]).startswith("owner a has 20")
    drained = Plan([job(1, "a", queued=8), jobs[1], jobs[2]], {}, policy, 0.0)
    assert drained.held == {}


def test_gpu_types_and_memory_decide_which_workers_take_a_job():
    h200 = job(1, "a", gpu_type="H200")
    big = job(2, "b", min_memory_gb=100)
    anyone = job(3, "c")
    plan = Plan([h200, big, anyone], {}, Policy(), 0.0)
    assert plan.blocked(h200, "H100") == "needs a GPU H200"
    assert plan.blocked(big, "H100") == "needs a GPU >= 100 GB" and plan.blocked(big, "H200") is None
    assert plan.pick("H100") == anyone
    assert plan.reason(h200, ["H100"]) == "needs a GPU H200" and plan.reason(h200, ["H100", "H200"]) is None


def test_steady_contention_converges_to_the_weights_with_usage_charged():
    """Two owners of weights 2 and 1 on 6 workers, trials of random length on a virtual clock, usage
    charged as trials end: over the second half each holds its weight's share within 5%."""
    rng = random.Random(7)
    policy = Policy.from_dict({"owners": {"a": {"weight": 2}}, "half_life": "1h"})
    jobs = {1: job(1, "a", queued=10**6), 2: job(2, "b", queued=10**6)}
    usage: dict[str, float] = {}
    clock, running, held_s = 0.0, [], {"a": 0.0, "b": 0.0}
    while clock < 10 * HOUR:
        while len(running) < 6:
            plan = Plan(list(jobs.values()), usage, policy, clock)
            picked = plan.pick()
            plan.take(picked)  # running + 1, and it got a worker now
            jobs[picked.job_id] = next(j for j in plan.jobs if j.job_id == picked.job_id)
            running.append((clock + rng.uniform(30, 300), picked.job_id, clock))
        running.sort()
        end, job_id, start = running.pop(0)
        j = jobs[job_id]
        jobs[job_id] = JobState(**{**j.__dict__, "running": j.running - 1})
        usage = {o: decayed(u, end - clock, policy.half_life) for o, u in usage.items()}
        usage[j.owner] = usage.get(j.owner, 0.0) + (end - start)
        if start >= 5 * HOUR:
            held_s[j.owner] += end - start
        clock = end
    share = held_s["a"] / sum(held_s.values())
    assert abs(share - 2 / 3) < 0.05, share


def test_target_workers_share_out_what_an_owner_cannot_use_priority_and_gpu_types_first():
    plan = Plan([job(1, "a", queued=1), job(2, "b"), job(3, "c")], {}, Policy(), 0.0)
    assert target_workers(plan, 9) == {"a": 1.0, "b": 4.0, "c": 4.0}
    # CI's two trials at priority 10 first; b can run only on the 2 H200s; c takes what is left
    jobs = [job(1, "ci", priority=10, queued=2), job(2, "b", gpu_type="H200"), job(3, "c")]
    plan = Plan(jobs, {}, Policy(), 0.0)
    assert target_workers(plan, {"H100": 6, "H200": 2}) == {"ci": 2.0, "b": 2.0, "c": 4.0}


def test_preemption_takes_a_lower_priority_or_over_share_trial_past_its_minimum_run():
    policy = Policy.from_dict({"preempt": {"enabled": True, "min_run": "60s", "again_after": "10m"}})
    low = job(1, "a", running=2, queued=5)
    ci = job(2, "ci", priority=10, queued=1)
    now = 1000.0
    running = [RunningTrial(11, 1, None, started_s=now - 300), RunningTrial(12, 1, None, started_s=now - 30)]
    assert Plan([low, ci], {}, policy, now).pick_victim(running, None).trial_id == 11  # 12 ran < 60 s
    again = [RunningTrial(11, 1, None, now - 300, preempted_s=now - 60), running[1]]
    assert Plan([low, ci], {}, policy, now).pick_victim(again, None) is None  # stopped a minute ago
    off = Policy()
    assert Plan([low, ci], {}, off, now).pick_victim(running, None) is None
    # equal priority: a holds both workers, b none: a is over its share, one of its trials yields
    fair = [job(1, "a", running=2), job(2, "b")]
    assert Plan(fair, {}, policy, now).pick_victim(running, None).trial_id == 11
    # at its share (one each) nobody yields
    even = [job(1, "a", running=1), job(2, "b", running=1)]
    assert Plan(even, {}, policy, now).pick_victim(running[:1], None) is None


def test_a_trial_that_needs_its_gpu_type_does_not_yield_to_a_job_that_could_run_elsewhere():
    policy = Policy.from_dict({"preempt": {"enabled": True, "min_run": 0}})
    mla = job(1, "a", running=1, gpu_type="H200")
    now, types = 1000.0, ["H100", "H200"]
    on_h200 = [RunningTrial(11, 1, "H200", started_s=now - 300)]
    anywhere = job(2, "ci", priority=10)
    assert Plan([mla, anywhere], {}, policy, now).pick_victim(on_h200, "H200", types) is None
    needs_h200 = job(2, "ci", priority=10, gpu_type="H200")
    assert Plan([mla, needs_h200], {}, policy, now).pick_victim(on_h200, "H200", types).trial_id == 11
