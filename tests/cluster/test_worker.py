"""cluster.worker: a timing worker runs at normal priority.

Ray starts workers at niceness 15; beside one busy process at 0 such a worker gets about 3% of a core,
and its CPU timings measure the neighbours (seen: the test suite beside two busy loops barely moved)."""

from __future__ import annotations

import os
import subprocess
import sys

import ray

from cluster.worker import RemoteWorker

RENICED = """
import os
from cluster.worker import normal_priority
os.nice(10)
print(os.getpriority(os.PRIO_PROCESS, 0), normal_priority())
"""


def test_a_worker_started_nicer_raises_itself_back_to_0_where_allowed():
    proc = subprocess.run([sys.executable, "-c", RENICED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert before == 10
    assert after == (0 if os.geteuid() == 0 else 10)  # lowering niceness needs root or CAP_SYS_NICE


def test_a_ready_worker_of_the_farms_local_ray_times_at_niceness_0_with_its_timing_core_loaded(ray_local):
    """At niceness 0: the Ray setting itself, not only the worker's own renice (a non-root farm gets 0
    too). Loaded: no trial pays for importing torch and SciPy, since the worker imports the measurement
    core before it answers `info` (kernels.measure imports lazily; seen: under load, each fresh worker
    importing SciPy inside its first trial made every trial of a 1.5 s timeout time out)."""
    import psutil

    worker = RemoteWorker.options(num_cpus=0, num_gpus=1).remote("ready-check")
    try:
        info = ray.get(worker.info.remote(), timeout=120)
        assert info["niceness"] == 0
        assert os.environ.get("RAY_worker_niceness") == "0"
        assert os.getpriority(os.PRIO_PROCESS, info["pid"]) == 0
        mapped = {m.path for m in psutil.Process(info["pid"]).memory_maps()}
        assert any("/scipy/stats/" in path for path in mapped), "SciPy's stats not loaded at ready"
        assert any("/torch/lib/" in path for path in mapped), "torch not loaded at ready"
    finally:
        ray.kill(worker, no_restart=True)
