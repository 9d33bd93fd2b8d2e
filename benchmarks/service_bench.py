"""The farm as a service (issue 31), on this machine: how fast the interactive loop and the queue answer.

- `farm --help` and `farm bench` of one point, from the shell (a fresh process each, as a user runs them);
- a warm pool (`farm pool serve` in this process, on a local Ray): time from `farm submit` to the first
  trial of a job starting, and to a 10-trial job completing;
- two priorities: a long low-priority sweep, then a short high-priority job submitted while it runs; the
  share of the workers' time each job had, per quarter second, and how long the high job waited for its
  first worker against one trial's time;
- beside them, `farm sweep run` of the same 10-trial spec (a local Ray of its own each time).

Targets (issue 31): --help under 0.5 s, farm bench under 2 s (printed beside its floor, a fresh `import
torch`, measured in the same run), first trial within 1 s, the 10-trial job
within 5 s; the high-priority job's first trial within about one trial's time.

    .venv/bin/python -m benchmarks service
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FARM = [sys.executable, "-m", "jobs.entry"]
SPEC = """
name: {name}
family: probe
backends: [{{name: wait, baseline: true, configs: {{grid: {{ms: [{ms}]}}}}}}]
shapes: {{grid: {{n: {grid}}}}}
measure: {{warmup_ms: 0, min_samples: 3, max_samples: 3, max_time_s: 5.0, seeds: 1}}
timeout_s: 60
"""


def _spec(name: str, n: int, ms: float):
    from jobs.spec.sweep import loads_spec

    return loads_spec(SPEC.format(name=name, grid=list(range(n)), ms=ms))


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def _shares(
    trials, t0: float, jobs: dict[int, str], step: float = 0.25
) -> list[tuple[float, dict[str, float]]]:
    """Per window of `step` seconds from t0: the fraction of the busy worker time each job had."""
    spans = [(t.job_id, t.started_at.timestamp(), t.finished_at.timestamp()) for t in trials if t.started_at]
    end = max(f for _, _, f in spans)
    out = []
    w = t0
    while w < end:
        busy = {name: 0.0 for name in jobs.values()}
        for job_id, s, f in spans:
            busy[jobs[job_id]] += max(0.0, min(f, w + step) - max(s, w))
        total = sum(busy.values())
        out.append((w - t0, {k: v / total if total else 0.0 for k, v in busy.items()}))
        w += step
    return out


def main() -> dict:
    from jobs.queue.pool import PoolOptions, serve
    from jobs.queue.queue import Queue
    from jobs.run.runner import RunOptions
    from jobs.store import Store

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }
    res: dict = {}
    res["help_s"] = min(_wall([*FARM, "--help"], env) for _ in range(3))
    res["bench_one_point_s"] = min(
        _wall([*FARM, "bench", "gemm", "--shape", "m=64,n=64,k=64"], env) for _ in range(2)
    )
    # the floor of any command that runs a kernel: a fresh interpreter importing torch, in the same run
    res["torch_import_s"] = min(_wall([sys.executable, "-c", "import torch"], env) for _ in range(2))

    tmp = Path(tempfile.mkdtemp(prefix="service-bench-"))
    store = Store(str(tmp / "farm.db"))
    queue = Queue(store)
    finished: dict[int, threading.Event] = {}

    def submit(name: str, n: int, ms: float, priority: int = 0) -> tuple[int, float]:
        t = time.perf_counter()
        job = queue.submit(_spec(name, n, ms), priority=priority, owner="bench")
        finished[job] = threading.Event()
        return job, t

    quiet = {"show_progress": False, "echo": lambda _m: None, "oversubscribe": True}
    options = PoolOptions(run=RunOptions(gpus=2, **quiet))
    options.on_finished = lambda job: finished[job].set()
    warm, _ = submit("warm-up", 2, 1)
    pool = threading.Thread(target=serve, args=(store, options), daemon=True)
    pool.start()
    finished[warm].wait(300)

    job, _ = submit("ten", 10, 1)
    finished[job].wait(120)
    first = min(t.started_at for t in store.trials(job))
    done = store.get_job(job).finished_at
    sub = store.get_job(job).created_at
    res["first_trial_s"] = (first - sub).total_seconds()  # worker clock vs store clock: one host here
    res["ten_trial_job_s"] = (done - sub).total_seconds()

    low, _ = submit("sweep", 24, 100)
    while not any(t.status != "pending" for t in store.trials(low)):
        time.sleep(0.05)
    high, _ = submit("ci", 4, 100, priority=10)
    finished[high].wait(120)
    finished[low].wait(300)
    options.stop.set()
    pool.join(60)
    trials = store.trials(low) + store.trials(high)
    t0 = min(t.started_at for t in trials).timestamp()
    res["shares"] = _shares(trials, t0, {low: "sweep (priority 0)", high: "ci (priority 10)"})
    high_trials = store.trials(high)
    one_trial = sorted((t.finished_at - t.started_at).total_seconds() for t in store.trials(low))[12]
    res["one_trial_s"] = one_trial
    high_first = min(t.started_at for t in high_trials)
    res["high_first_wait_s"] = (high_first - store.get_job(high).created_at).total_seconds()
    store.close()

    spec_path = tmp / "ten.yaml"
    spec_path.write_text(SPEC.format(name="ten", grid=list(range(10)), ms=1))
    run = [*FARM, "sweep", "run", str(spec_path), "--db", str(tmp / "run.db"), "--gpus", "2", "--quiet",
           "--no-report", "--oversubscribe"]  # fmt: skip
    res["sweep_run_s"] = _wall(run, env)
    print(report(res))
    return res


def report(res: dict) -> str:
    lines = [
        "the farm as a service (CPU, local Ray, 2 logical workers)",
        f"  farm --help                      {res['help_s']:6.2f} s   (target < 0.5 s)",
        f"  farm bench, one gemm point       {res['bench_one_point_s']:6.2f} s   (target < 2 s)",
        f"  python -c 'import torch' (floor) {res['torch_import_s']:6.2f} s   farm bench / floor "
        f"{res['bench_one_point_s'] / res['torch_import_s']:.2f}x",
        f"  warm pool: submit -> 1st trial   {res['first_trial_s']:6.2f} s   (target < 1 s)",
        f"  warm pool: 10-trial job          {res['ten_trial_job_s']:6.2f} s   (target < 5 s)",
        f"  farm sweep run, the same job     {res['sweep_run_s']:6.2f} s   (a local Ray of its own)",
        f"  priority 10 job's first worker   {res['high_first_wait_s']:6.2f} s after submit; one trial "
        f"{res['one_trial_s']:.2f} s",
        "  share of the workers' time per 0.25 s (sweep / ci):",
    ]
    for t, share in res["shares"]:
        vals = list(share.values())
        lines.append(f"    {t:5.2f} s  {vals[0]:4.0%} / {vals[1]:4.0%}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
