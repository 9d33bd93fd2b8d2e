"""`python -m benchmarks fairness`: a day of a team's submissions replayed against the pool's ordering
(jobs.queue.fairshare, the same Plan.pick and Plan.pick_victim the pool's claims and preemption use) with
simulated trial times on a virtual clock (no real sleeps, no Ray, no store).

The team (issue 47): four owners in three projects and CI, mixed priorities (0, 5, and CI's 10), jobs
that need an H200 or 100 GB and jobs that run anywhere, on 8 H100 and 8 H200 workers, about 10^4 trials
over 24 hours. Usage is charged as trials end and decays with the policy's half-life; preemption is on
(the simulated pool looks again when a waiting job passes preemption's patience or max_wait, as the
pool's loop does every few seconds).

Reported: each owner's share of the workers against its target over every hour it has work (the target:
the policy's target shares split max-min fairly over what each owner's jobs can use at each moment,
fairshare.target_workers), the longest wait of a job for its first worker, CI's start delay against one
trial's time, preemptions and the worker time they wasted, and that every trial completed exactly once.
Targets: share within 5 points of target per hour, no first wait over max_wait, waste under 2%, CI within
one (median) trial's time. The reported day (seed 47, 24 h), then other draws (`--seeds`, default 1-20)
at each length (`--hours`, default 24 and 8), each with every owner-hour's deviation, then what a claim
costs with 64 jobs waiting on SQLite and PostgreSQL (benchmarks.fairness_claims; `--claims 0` skips it).
The text goes to benchmarks/results/fairness-seeds-<host>-<date>.md.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import platform
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from jobs.queue.fairshare import JobState, Plan, RunningTrial, decayed, target_workers
from jobs.queue.policy import Policy

HOUR = 3600.0
POLICY = {
    "half_life": "1d",
    "max_wait": "1h",
    "owners": {"ana": {"weight": 1}, "bo": {"weight": 1}, "cy": {"weight": 1}, "dee": {"weight": 1}},
    "projects": {
        "kernels": {"weight": 2, "owners": ["ana", "bo"]},
        "serving": {"weight": 1, "owners": ["cy"]},
        "research": {"weight": 1, "owners": ["dee"]},
    },
    "preempt": {"enabled": True, "min_run": "2m", "again_after": "10m"},
}  # fmt: skip
WORKERS = {"H100": 8, "H200": 8}


@dataclass
class Submission:
    at_s: float
    owner: str
    priority: int
    trials_s: list[float]  # each trial's time on a worker
    gpu_type: str | None = None
    min_memory_gb: float | None = None


# owner: (jobs, trials per job, median trial s, first and last arrival hour, share needing a GPU, priority 5)
TEAM = {
    "ana": (9, (200, 420), 110.0, (0, 18), None, 0.2),
    "bo": (12, (100, 260), 70.0, (1, 20), ("H200", None), 0.0),
    "cy": (14, (80, 220), 60.0, (0, 22), (None, 100.0), 0.1),
    "dee": (10, (150, 400), 90.0, (6, 16), None, 0.0),
}


def team_day(seed: int = 47, hours: float = 24.0) -> list[Submission]:
    """A day of the team's submissions (seeded): each owner's jobs at random times, a third of bo's and
    cy's needing a GPU type or memory, some at priority 5; CI's 4-trial jobs at priority 10 every 30 min."""
    rng = random.Random(seed)
    scale = hours / 24.0
    subs: list[Submission] = []
    for owner, (jobs, (lo, hi), trial_s, (first, last), need, p5) in TEAM.items():
        for i in range(max(1, round(jobs * scale))):
            at = rng.uniform(first, last) * HOUR * scale
            mid = trial_s * rng.uniform(0.6, 1.4)
            times = [rng.lognormvariate(0.0, 0.3) * mid for _ in range(rng.randint(lo, hi))]
            gpu, memory = need if need is not None and i % 3 == 1 else (None, None)  # a third of them
            subs.append(Submission(at, owner, 5 if rng.random() < p5 else 0, times, gpu, memory))
    t = 0.25 * HOUR
    while t < hours * HOUR:
        subs.append(Submission(t, "ci", 10, [rng.uniform(15.0, 30.0) for _ in range(4)]))
        t += 0.5 * HOUR
    return sorted(subs, key=lambda s: s.at_s)


@dataclass
class _Job:
    id: int
    sub: Submission
    next: int = 0  # trials started from the grid (requeued ones come back through `again`)
    again: list[int] = field(default_factory=list)  # preempted trials, run before the next new one
    running: int = 0
    done: int = 0
    last_taken: float | None = None
    first_start: float | None = None

    def state(self) -> JobState:
        s = self.sub
        queued = len(s.trials_s) - self.next + len(self.again)
        return JobState(self.id, s.owner, s.priority, s.at_s, queued, self.running, self.last_taken,
                        gpu_type=s.gpu_type, min_memory_gb=s.min_memory_gb)  # fmt: skip


@dataclass
class _Run:
    job: _Job
    trial: int
    worker: int
    start: float
    end: float


@dataclass
class Outcome:
    """What the day gave: per owner and hour the worker-seconds held and targeted, and the counts."""

    workers: int
    hours: int
    held: dict[str, list[float]]
    target: dict[str, list[float]]
    has_work: dict[str, set[int]]
    first_wait: dict[int, float]  # job -> seconds to its first worker
    ci_delay: list[float]
    trial_s: list[float]
    completions: dict[tuple[int, int], int]
    trials: int
    preemptions: int = 0
    wasted_s: float = 0.0
    busy_s: float = 0.0
    owner_of: dict[int, str] = field(default_factory=dict)


class Day:
    """The event loop: arrivals and trial ends on a virtual clock; after each, free workers take trials
    in the Plan's order and, with preemption on, each all-busy GPU type may stop one trial."""

    def __init__(self, subs: list[Submission], policy: Policy, workers: dict[str, int], hours: int) -> None:
        self.subs, self.policy, self.hours = list(subs), policy, hours
        self.workers = dict(workers)
        self.types = [t for t, n in workers.items() for _ in range(n)]
        self.free = set(range(len(self.types)))
        self.jobs: dict[int, _Job] = {}
        self.heap: list[tuple[float, int]] = []
        self.runs: dict[int, _Run] = {}
        self.usage: dict[str, float] = {}
        self.stopped_at: dict[tuple[int, int], float] = {}
        self.now, self.seq, self.tw = 0.0, 0, {}
        owners = {s.owner for s in subs}
        n = len(self.types)
        self.out = Outcome(n, hours, {o: [0.0] * hours for o in owners}, {o: [0.0] * hours for o in owners},
                           defaultdict(set), {}, [], [t for s in subs for t in s.trials_s], defaultdict(int),
                           sum(len(s.trials_s) for s in subs))  # fmt: skip

    def run(self) -> Outcome:
        arrivals = iter(self.subs)
        coming = next(arrivals, None)
        while coming is not None or self.heap:
            ends = self.heap[0][0] if self.heap else float("inf")
            at = min(ends, coming.at_s if coming is not None else float("inf"), self._wake())
            self._integrate(at)
            self._age(at)
            while self.heap and self.heap[0][0] <= at:
                _end, rid = heapq.heappop(self.heap)
                if rid in self.runs:
                    self._finish(self.runs.pop(rid))
            while coming is not None and coming.at_s <= at:
                job = _Job(len(self.jobs) + 1, coming)
                self.jobs[job.id], self.out.owner_of[job.id] = job, coming.owner
                coming = next(arrivals, None)
            self._dispatch()
            if self.policy.preempt.enabled:
                while self._preempt():
                    self._dispatch()
            self._aim()
        return self.out

    def _wake(self) -> float:
        """The next moment a waiting job passes preemption's patience or max_wait: the pool looks again
        every few seconds, so preemption may act then, not only at the next arrival or trial end."""
        if not self.policy.preempt.enabled:
            return float("inf")
        marks = (self.policy.preempt.patience, self.policy.max_wait)
        since = [max(j.last_taken or 0.0, j.sub.at_s) for j in self.jobs.values() if j.state().queued > 0]
        return min((t + m for t in since for m in marks if t + m > self.now), default=float("inf"))

    def _plan(self) -> Plan:
        live = [j.state() for j in self.jobs.values() if j.done < len(j.sub.trials_s)]
        return Plan(live, dict(self.usage), self.policy, self.now)

    def _dispatch(self) -> None:
        plan = self._plan()
        for worker in sorted(self.free):
            state = plan.pick(self.types[worker])
            if state is None:
                continue
            plan.take(state)
            job = self.jobs[state.job_id]
            trial = job.again.pop(0) if job.again else job.next
            job.next += 0 if trial != job.next else 1
            job.running, job.last_taken = job.running + 1, self.now
            if job.first_start is None:
                job.first_start = self.now
                self.out.first_wait[job.id] = self.now - job.sub.at_s
                if job.sub.priority >= 10:
                    self.out.ci_delay.append(self.now - job.sub.at_s)
            self.free.discard(worker)
            self.seq += 1
            run = _Run(job, trial, worker, self.now, self.now + job.sub.trials_s[trial])
            self.runs[self.seq] = run
            heapq.heappush(self.heap, (run.end, self.seq))

    def _preempt(self) -> bool:
        """Stop one trial on an all-busy GPU type that the job next in line has more right to."""
        plan = self._plan()
        for gpu_type in sorted(set(self.types)):
            if any(self.types[w] == gpu_type for w in self.free):
                continue
            stopped = self.stopped_at
            running = [RunningTrial(rid, r.job.id, gpu_type, r.start, stopped.get((r.job.id, r.trial)))
                       for rid, r in self.runs.items() if self.types[r.worker] == gpu_type]  # fmt: skip
            victim = plan.pick_victim(running, gpu_type, list(self.workers))
            if victim is None:
                continue
            run = self.runs.pop(victim.trial_id)
            run.job.running -= 1
            run.job.again.append(run.trial)
            self.stopped_at[(run.job.id, run.trial)] = self.now
            self._charge(run, self.now)
            self.out.preemptions += 1
            self.out.wasted_s += self.now - run.start
            self.free.add(run.worker)
            return True
        return False

    def _finish(self, run: _Run) -> None:
        run.job.running -= 1
        run.job.done += 1
        self.out.completions[(run.job.id, run.trial)] += 1
        self.free.add(run.worker)
        self._charge(run, run.end)

    def _charge(self, run: _Run, end: float) -> None:
        """Usage (as the pool charges it) and the held worker-seconds per hour."""
        owner = run.job.sub.owner
        self.usage[owner] = self.usage.get(owner, 0.0) + (end - run.start)
        self.out.busy_s += end - run.start
        for h, seconds in _per_hour(run.start, end, self.hours):
            self.out.held[owner][h] += seconds

    def _age(self, at: float) -> None:
        self.usage = {o: decayed(u, at - self.now, self.policy.half_life) for o, u in self.usage.items()}
        self.now = at

    def _aim(self) -> None:
        """The targets (water-filled by what each owner can use) until the next event."""
        self.tw = target_workers(self._plan(), self.workers)

    def _integrate(self, until: float) -> None:
        for owner, workers in self.tw.items():
            for h, seconds in _per_hour(self.now, until, self.hours):
                self.out.target[owner][h] += workers * seconds
                if workers > 0:
                    self.out.has_work[owner].add(h)


def _per_hour(start: float, end: float, hours: int):
    """(hour, seconds of [start, end) in it)."""
    t = start
    while t < end:
        h = int(t // HOUR)
        stop = min(end, (h + 1) * HOUR)
        if h < hours:
            yield h, stop - t
        t = stop


def figures(out: Outcome, policy: Policy) -> dict:
    """The day's figures: per owner its worst hour, and the totals checked against the targets."""
    cap = out.workers * HOUR
    owners = {}
    for owner in sorted(out.held):
        hours = sorted(out.has_work.get(owner, set()))
        gaps = [abs(out.held[owner][h] - out.target[owner][h]) / cap for h in hours]
        waits = [w for j, w in out.first_wait.items() if out.owner_of[j] == owner]
        owners[owner] = {
            "hours_with_work": len(hours),
            "hours_within_5pct": sum(g <= 0.05 for g in gaps),
            "worst_gap_pts": round(100 * max(gaps, default=0.0), 2),
            "share_pct": round(100 * sum(out.held[owner][h] for h in hours) / (cap * max(1, len(hours))), 1),
            "target_pct": round(
                100 * sum(out.target[owner][h] for h in hours) / (cap * max(1, len(hours))), 1
            ),
            "longest_first_wait_s": round(max(waits, default=0.0), 1),
        }
    once = all(n == 1 for n in out.completions.values()) and len(out.completions) == out.trials
    trial_s = median(out.trial_s)
    return {
        "workers": out.workers, "trials": out.trials, "owners": owners,
        "longest_first_wait_s": round(max(out.first_wait.values()), 1), "max_wait_s": policy.max_wait,
        "ci_longest_start_s": round(max(out.ci_delay, default=0.0), 1), "median_trial_s": round(trial_s, 1),
        "preemptions": out.preemptions, "wasted_pct": round(100 * out.wasted_s / max(out.busy_s, 1.0), 3),
        "every_trial_once": once,
    }  # fmt: skip


def table(fig: dict) -> str:
    """The figures as the markdown table saved under benchmarks/results."""
    lines = [
        f"# fairness: a day of a team on {fig['workers']} workers (8 H100 + 8 H200), {fig['trials']} trials",
        "",
        "| owner | hours with work | hours within 5 pts | worst hour gap (pts) | share | target "
        "| longest first wait |",
        "|---|---|---|---|---|---|---|",
    ]
    for owner, o in fig["owners"].items():
        cells = [
            owner,
            o["hours_with_work"],
            o["hours_within_5pct"],
            o["worst_gap_pts"],
            f"{o['share_pct']}%",
            f"{o['target_pct']}%",
            f"{o['longest_first_wait_s']:.0f} s",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        f"- longest wait for a first worker: {fig['longest_first_wait_s']:.0f} s "
        f"(max_wait {fig['max_wait_s']:.0f} s)",
        f"- CI (priority 10) longest start: {fig['ci_longest_start_s']:.0f} s; median trial "
        f"{fig['median_trial_s']:.0f} s (ratio {fig['ci_longest_start_s'] / fig['median_trial_s']:.2f})",
        f"- preemptions: {fig['preemptions']}, wasted worker time {fig['wasted_pct']}% of busy time",
        f"- every trial completed exactly once: {fig['every_trial_once']}",
    ]
    return "\n".join(lines) + "\n"


def deviations(out: Outcome) -> str:
    """Every owner-hour: the owner's share minus its target, in points of all workers (signed; `.`: no
    work that hour), as a markdown table."""
    cap = out.workers * HOUR
    head = "| owner | " + " | ".join(str(h) for h in range(out.hours)) + " |"
    rows = [head, "|---" * (out.hours + 1) + "|"]
    for owner in sorted(out.held):
        work = out.has_work.get(owner, set())
        cells = [f"{100 * (out.held[owner][h] - out.target[owner][h]) / cap:+.1f}" if h in work else "."
                 for h in range(out.hours)]  # fmt: skip
        rows.append(f"| {owner} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def days(seeds: list[int], hours: list[int], policy: Policy) -> tuple[list[dict], str]:
    """Each draw of the day (seed) at each length: one summary line each, then every owner-hour's
    deviation per day."""
    rows = ["", "| hours | seed | trials | owner-hours within 5 pts | worst gap (pts) | longest first wait "
            "(max_wait) | CI longest start / median trial | preemptions | waste | every trial once |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    grids, figs = [], []
    for length in hours:
        for seed in seeds:
            out = Day(team_day(seed, length), policy, WORKERS, length).run()
            f = figures(out, policy) | {"seed": seed, "hours": length}
            figs.append(f)
            owners = f["owners"].values()
            within = (
                f"{sum(o['hours_within_5pct'] for o in owners)}/{sum(o['hours_with_work'] for o in owners)}"
            )
            worst = max(o["worst_gap_pts"] for o in owners)
            ci = f"{f['ci_longest_start_s']:.0f} s / {f['median_trial_s']:.0f} s"
            cells = [length, seed, f["trials"], within, worst,
                     f"{f['longest_first_wait_s']:.0f} s ({f['max_wait_s']:.0f} s)", ci, f["preemptions"],
                     f"{f['wasted_pct']}%", f["every_trial_once"]]  # fmt: skip
            rows.append("| " + " | ".join(str(c) for c in cells) + " |")
            grids += [
                "",
                f"Seed {seed}, {length} h: share minus target per hour (points)",
                "",
                deviations(out),
            ]
    return figs, "\n".join(rows) + "\n" + "\n".join(grids)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fairness")
    parser.add_argument("--seed", type=int, default=47, help="the reported day")
    parser.add_argument("--seeds", type=_ints, default=list(range(1, 21)), help="other draws, e.g. 1,2,3")
    parser.add_argument("--hours", type=_ints, default=[24, 8], help="day lengths for the draws")
    parser.add_argument("--claims", type=int, default=200, help="claims timed per store (0: none)")
    parser.add_argument("--no-postgres", action="store_true", help="time claims on SQLite only")
    args = parser.parse_args(argv or [])
    policy = Policy.from_dict(POLICY)
    fig = figures(Day(team_day(args.seed, 24), policy, WORKERS, 24).run(), policy)
    fig["days"], text = days(args.seeds, args.hours, policy)
    command = " ".join(["python -m benchmarks fairness", *(argv or [])])
    text = f"Command: `{command}`\n\n" + table(fig) + "\nOther draws of the day:\n" + text
    if args.claims:
        from benchmarks.fairness_claims import lines, on_both_stores

        fig["claim_cost"] = on_both_stores(policy, args.claims, postgres=not args.no_postgres)
        text += lines(fig["claim_cost"])
    print(text, end="")
    stamp = datetime.datetime.now().strftime("%Y%m%d")
    path = Path(__file__).parent / "results" / f"fairness-seeds-{platform.node()}-{stamp}.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    print(f"(table written to {path})")
    return fig
