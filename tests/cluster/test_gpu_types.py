"""GPU types on a real two-node Ray cluster (ray.cluster_utils.Cluster) whose nodes declare two
accelerator types, 2 logical GPUs each (issue 47): a pool places a job's trials only on workers of the
type its spec needs, records the type each trial ran on, and a job that needs no type runs anywhere."""

from __future__ import annotations

import re

import pytest
import raykit
from ray.cluster_utils import Cluster

from cluster import session
from jobs.queue.policy import Policy
from jobs.queue.pool import PoolOptions, serve
from jobs.queue.queue import Queue
from jobs.run.runner import RunOptions
from jobs.spec.sweep import loads_spec
from jobs.store import Store

pytestmark = pytest.mark.multinode

PROBE = """
name: {name}
family: probe
backends: [{{name: wait, baseline: true, configs: {{grid: {{ms: [50]}}}}}}]
shapes: {{grid: {{n: {grid}}}}}
measure: {{warmup_ms: 0, min_samples: 2, max_samples: 2, max_time_s: 5.0, seeds: 1}}
timeout_s: 60
"""


@pytest.fixture(scope="module")
def typed_nodes():
    raykit.leave_local_ray()  # this process joins the typed cluster instead (one Ray at a time)
    head = {"num_cpus": 1, "num_gpus": 2, "resources": {"accelerator_type:H100": 1}}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    h200 = cluster.add_node(num_cpus=1, num_gpus=2, resources={"accelerator_type:H200": 1})
    cluster.wait_for_nodes()
    yield cluster, h200.node_id
    session.disconnect()
    cluster.shutdown()


def test_trials_run_only_on_workers_of_the_gpu_type_their_job_needs(typed_nodes, tmp_path):
    cluster, h200_node = typed_nodes
    store = Store(str(tmp_path / "farm.db"))
    queue = Queue(store)

    def submit(name: str, n: int, gpu: str = "") -> int:
        return queue.submit(loads_spec(PROBE.format(name=name, grid=list(range(n))) + gpu))

    need = {
        submit("mla", 8, "gpu: {type: H200}\n"): "H200",
        submit("gemm", 8, "gpu: {type: H100}\n"): "H100",
        submit("big", 4, "gpu: {min_memory_gb: 100}\n"): "H200",  # only the H200 has 100 GB
        submit("any", 8): None,
    }
    run = RunOptions(address=cluster.address, show_progress=False, echo=lambda _m: None, oversubscribe=True)
    assert serve(store, PoolOptions(run=run, idle_exit_s=0.5)) == 4
    for job, gpu_type in need.items():
        trials = store.trials(job)
        assert all(t.status == "ok" and t.attempt == 1 for t in trials), [(t.status, t.error) for t in trials]
        ran_on = {t.gpu_type for t in trials}
        on_h200 = {t.node.split("/")[1] == h200_node[:6] for t in trials}
        if gpu_type is None:
            assert ran_on <= {"H100", "H200"}
        else:
            assert ran_on == {gpu_type}, (job, ran_on)
            assert on_h200 == {gpu_type == "H200"}  # the type recorded is the node's
    store.close()


def test_best_fit_h200_workers_serve_the_job_that_needs_them_while_the_flexible_one_runs_on_h100s(
    typed_nodes, tmp_path
):
    """Best fit (jobs.queue.fairshare, step 6) on real Ray: ana's job runs anywhere, bo's needs an H200,
    both queued at priority 0 before the pool starts. ana weighs 20 (her target stays over 5 times bo's
    whatever their usage), so the plain order gives every free worker, H200s included, to her while she
    has trials waiting; best fit (tolerance 1 here: the share arithmetic is tested as a pure function)
    gives the H200s to bo. The pool opens when its 4 workers are ready and fills each once, so ana's
    trials start on the H100s while bo's run. Claim order is the store's: the jobs' "taken" lines by id.
    With best_fit 0 the H200s' first claims are ana's and the test fails; so it does when the pool's
    read-ahead (a trial claimed for a free H100) runs on a free H200 before the queue is asked for one."""
    cluster, _ = typed_nodes
    store = Store(str(tmp_path / "farm.db"))
    policy = Policy.from_dict({"owners": {"ana": {"weight": 20}}, "best_fit": 1.0})
    queue = Queue(store, policy)
    any_gpu = queue.submit(loads_spec(PROBE.format(name="any", grid=list(range(8)))), owner="ana")
    h200_spec = PROBE.format(name="mla", grid=list(range(6))) + "gpu: {type: H200}\n"
    h200 = queue.submit(loads_spec(h200_spec), owner="bo")
    run = RunOptions(
        address=cluster.address,
        show_progress=False,
        echo=lambda _m: None,
        oversubscribe=True,
        ready_wait_s=600,
    )
    assert serve(store, PoolOptions(run=run, idle_exit_s=0.5, policy=policy)) == 2

    trials = {(job, t.seq): t for job in (any_gpu, h200) for t in store.trials(job)}
    assert len(trials) == 14
    assert all(t.status == "ok" and t.attempt == 1 for t in trials.values()), [
        (k, t.status, t.error) for k, t in trials.items()
    ]
    taken = sorted(
        (e.id, job, int(re.match(r"trial #(\d+) taken by ", e.line).group(1)))
        for job in (any_gpu, h200)
        for e in queue.events(job)
        if " taken by " in e.line
    )
    order = [(job, seq) for _, job, seq in taken]
    assert sorted(order) == sorted(trials), order  # every trial taken once
    assert {trials[k].gpu_type for k in order if k[0] == h200} == {"H200"}
    on_h200 = [job for job, seq in order if trials[(job, seq)].gpu_type == "H200"]
    assert on_h200 == sorted(on_h200, key=lambda job: job != h200), on_h200  # bo's first, then ana's
    last_bo = max(i for i, (job, _) in enumerate(order) if job == h200)
    meanwhile = {trials[k].gpu_type for k in order[:last_bo] if k[0] == any_gpu}
    assert meanwhile == {"H100"}, [(k, trials[k].gpu_type) for k in order]  # ana ran, on the H100s only
    store.close()
