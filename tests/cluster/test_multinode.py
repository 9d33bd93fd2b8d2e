"""A sweep on a real two-node Ray cluster (ray.cluster_utils.Cluster), 2 logical GPUs per node."""

from __future__ import annotations

import pytest
import ray
import raykit
from ray.cluster_utils import Cluster

from cluster import session
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store.repository import Store

pytestmark = pytest.mark.multinode


@pytest.fixture(scope="module")
def two_nodes():
    raykit.leave_local_ray()  # this process joins the two-node cluster instead
    head = {"num_cpus": 1, "num_gpus": 2, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1, num_gpus=2)
    cluster.wait_for_nodes()
    yield cluster
    session.disconnect()
    cluster.shutdown()


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
