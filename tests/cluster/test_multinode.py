"""A sweep on a real two-node Ray cluster (ray.cluster_utils.Cluster), 2 logical GPUs per node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import raykit
from ray.cluster_utils import Cluster

from cluster import session
from jobs.queue.queue import Queue
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store import Store

pytestmark = pytest.mark.multinode


@pytest.fixture(scope="module")
def two_nodes():
    raykit.leave_local_ray()  # this process joins the two-node cluster instead
    # the head runs its job API (`farm pool start`), whose entrypoints find `farm` on the nodes' PATH
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"
    head = {"num_cpus": 1, "num_gpus": 2, "include_dashboard": True, "dashboard_port": 0}
    # the head's job agent on a port of its own (Ray's default, 52365, may be held by another Ray here)
    head["dashboard_agent_listen_port"] = None
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1, num_gpus=2)
    cluster.wait_for_nodes()
    yield cluster
    session.disconnect()
    cluster.shutdown()
    os.environ["PATH"] = path


def test_sweep_joins_the_cluster_and_runs_on_both_nodes(two_nodes, tmp_path):
    store = Store(str(tmp_path / "farm.db"))
    spec = loads_spec("""
name: probe-2nodes
family: probe
backends: [{name: spin, baseline: true, configs: {grid: {ms: [300]}}}]
shapes: {grid: {n: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}}
measure: {warmup_ms: 0, min_samples: 1, max_samples: 2, max_time_s: 0.5}
timeout_s: 60
""")
    result = run_sweep(
        spec,
        store,
        # 4 logical GPUs on 2 CPU cores: this test is about placement, not timings
        RunOptions(address=two_nodes.address, show_progress=False, echo=lambda m: None, oversubscribe=True),
    )
    assert result.status == "completed" and result.exit_code == 0
    job = store.get_job(result.job_id)
    assert job.cluster["address"] == two_nodes.address
    assert job.cluster["workers"] == 4 and len(job.cluster["nodes"]) == 2
    trials = store.trials(result.job_id)
    assert len(trials) == 12 and all(t.status == "ok" for t in trials)
    node_ids = {n["node_id"][:6] for n in job.cluster["nodes"]}
    ran_on = {t.node.split("/")[1] for t in trials}
    assert ran_on == node_ids, (ran_on, node_ids)
    # each worker holds one GPU of its node: no two workers on the same node share a device
    pairs = {(t.node, t.gpu_id) for t in trials}
    assert len(pairs) == len({t.worker for t in trials})
    assert ray.is_initialized()
    store.close()


def _farm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    farm = Path(sys.executable).parent / "farm"
    return subprocess.run([str(farm), *args], capture_output=True, text=True, timeout=timeout)


def _until(what: str, done, timeout_s: float = 120):
    """Poll `done` (another process writes what it reads) until it returns a true value."""
    deadline = time.monotonic() + timeout_s
    while not (value := done()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)
    return value


PROBE = """
name: {name}
family: probe
backends: [{{name: wait, baseline: true, configs: {{grid: {{ms: [250]}}}}}}]
shapes: {{grid: {{n: {grid}}}}}
measure: {{warmup_ms: 0, min_samples: 2, max_samples: 2, max_time_s: 5.0, seeds: 1}}
timeout_s: 60
"""


def test_a_pool_started_as_a_ray_job_serves_two_submitters_by_priority(two_nodes, tmp_path):
    """Issue 31: `farm pool start` runs the pool's driver on the cluster (Ray's job API); a sweep and a
    CI job submitted from two processes (the CI submitter killed as soon as it printed its id) both
    finish, the CI job within about one trial per worker of being queued, every trial run once;
    `farm pool stop` ends the driver."""
    dashboard = "http://" + two_nodes.head_node.address_info["webui_url"]
    db = str(tmp_path / "farm.db")
    for name, n in (("sweep", 24), ("ci", 3)):
        (tmp_path / f"{name}.yaml").write_text(PROBE.format(name=name, grid=list(range(n))))
    sweep = int(_farm("submit", str(tmp_path / "sweep.yaml"), "--db", db).stdout)

    started = _farm("pool", "start", "--dashboard", dashboard, "--db", db, "--gpus", "4", "--oversubscribe")
    assert started.returncode == 0, started.stderr
    pool_id = started.stdout.strip()
    listed = _farm("pool", "list", "--dashboard", dashboard)
    assert pool_id in listed.stdout and "pool serve --address auto" in listed.stdout, listed
    store = Store(db)
    _until("the sweep's first trial", lambda: store.status_counts(sweep).get("ok", 0) >= 1)

    ci_submitter = subprocess.Popen(
        [str(Path(sys.executable).parent / "farm"), "submit", str(tmp_path / "ci.yaml"), "--db", db,
         "--priority", "10", "--owner", "ci"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    ci = int(ci_submitter.stdout.readline())
    ci_submitter.kill()  # the submitter goes away at once: the job is the cluster's now
    ci_submitter.wait()
    queued_at = _until("CI's queue row", lambda: (row := Queue(store).entry(ci)) and row.submitted_at)

    for job in (ci, sweep):
        waited = _farm("jobs", "wait", str(job), "--db", db, "--timeout", "150", timeout=180)
        assert waited.returncode == 0, waited.stderr
    trials = store.trials(sweep) + store.trials(ci)
    assert len(trials) == 27 and all(t.status == "ok" and t.attempt == 1 for t in trials)
    assert all(len(store.samples(t.id)) == 2 for t in trials)  # each written once
    before = [t for t in store.trials(sweep) if t.started_at < queued_at]
    assert len(before) < 24, "CI's job came after the whole sweep had started: nothing was tested"
    first_ci = min(t.started_at for t in store.trials(ci))
    # once CI's job is queued, at most what the 4 workers had already taken of the sweep starts before it
    overtaking = [t for t in store.trials(sweep) if queued_at <= t.started_at < first_ci]
    assert len(overtaking) <= 4, [(t.seq, t.started_at) for t in overtaking]

    stopped = _farm("pool", "stop", pool_id, "--dashboard", dashboard)
    assert stopped.returncode == 0 and "stopping" in stopped.stderr, stopped
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    status = _until(
        "the pool's Ray job to end", lambda: (s := client.get_job_status(pool_id)).is_terminal() and s
    )
    assert status.value == "STOPPED"
    unknown = _farm("pool", "stop", "raysubmit_none", "--dashboard", dashboard)
    assert unknown.returncode == 2 and "raysubmit_none" in unknown.stderr
    unknown = _farm("pool", "logs", "raysubmit_none", "--dashboard", dashboard)
    assert unknown.returncode == 2 and "raysubmit_none" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    store.close()


def test_the_pool_gives_a_node_that_joins_workers_of_its_own(two_nodes, tmp_path):
    """Issue 31: the pool follows the cluster: a node that joins while the pool is up (between two jobs)
    gets one worker per GPU, and the next job's trials run there too."""
    import threading

    from ray.util.state import list_actors

    from jobs.queue.pool import PoolOptions, serve

    store = Store(str(tmp_path / "farm.db"))
    queue = Queue(store)
    finished = {name: threading.Event() for name in ("before", "after")}
    lines: list[str] = []
    run = RunOptions(address=two_nodes.address, show_progress=False, echo=lines.append, oversubscribe=True)
    options = PoolOptions(run=run)
    jobs: dict[int, str] = {}
    options.on_finished = lambda job: finished[jobs[job]].set()
    jobs[queue.submit(loads_spec(PROBE.format(name="before", grid=[0, 1])))] = "before"
    pool = threading.Thread(target=serve, args=(store, options), daemon=True)
    pool.start()
    joined = None
    try:
        assert finished["before"].wait(120), lines
        joined = two_nodes.add_node(num_cpus=1, num_gpus=2)
        two_nodes.wait_for_nodes()
        node_id = joined.node_id

        def workers_up_there() -> bool:
            alive = list_actors(filters=[("node_id", "=", node_id), ("state", "=", "ALIVE")])
            return len(alive) == 2

        _until("two workers alive on the node that joined", workers_up_there)
        assert any("worker(s) added" in line for line in lines), lines
        after = queue.submit(loads_spec(PROBE.format(name="after", grid=list(range(16)))))
        jobs[after] = "after"
        assert finished["after"].wait(120), lines
        trials = store.trials(after)
        assert all(t.status == "ok" and t.attempt == 1 for t in trials)
        assert {t.node.split("/")[1] for t in trials} >= {node_id[:6]}, [t.node for t in trials]
    finally:
        options.stop.set()
        pool.join(60)
        if joined is not None:
            two_nodes.remove_node(joined)
        store.close()


def test_the_pool_finishes_every_queued_trial_once_when_a_node_is_lost(two_nodes, tmp_path):
    """Issue 31: a pool serving the queue on two nodes loses one mid-queue (its raylet and workers
    killed): the trials in flight there are retried on the other node, none is lost or run twice."""
    from jobs.queue.pool import PoolOptions, serve
    from jobs.queue.queue import Queue

    store = Store(str(tmp_path / "farm.db"))
    spec = loads_spec("""
name: pool-node-loss
family: probe
backends: [{name: wait, baseline: true, configs: {grid: {ms: [200]}}}]
shapes: {grid: {n: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}}
measure: {warmup_ms: 0, min_samples: 2, max_samples: 2, max_time_s: 5.0, seeds: 1}
timeout_s: 60
""")
    job = Queue(store).submit(spec, priority=1)
    lost: list[str] = []
    worker_node = two_nodes.worker_nodes and next(iter(two_nodes.worker_nodes))

    def observer(result, info) -> None:
        if not lost and result.status == "ok" and worker_node is not None:
            lost.append(worker_node.unique_id)
            two_nodes.remove_node(worker_node, allow_graceful=False)

    run = RunOptions(address=two_nodes.address, show_progress=False, echo=lambda m: None, oversubscribe=True,
                     observer=observer)  # fmt: skip
    assert serve(store, PoolOptions(run=run, idle_exit_s=0.5)) == 1
    assert lost, "the node was never removed"
    trials = store.trials(job)
    assert store.get_job(job).status == "completed"
    assert all(t.status == "ok" for t in trials), [(t.seq, t.status, t.error) for t in trials]
    assert all(len(store.samples(t.id)) == 2 for t in trials)  # each written once
    store.close()
