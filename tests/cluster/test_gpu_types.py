"""GPU types on a real two-node Ray cluster (ray.cluster_utils.Cluster) whose nodes declare two
accelerator types, 2 logical GPUs each (issue 47): a pool places a job's trials only on workers of the
type its spec needs, records the type each trial ran on, and a job that needs no type runs anywhere."""

from __future__ import annotations

import pytest
import raykit
from ray.cluster_utils import Cluster

from cluster import session
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
