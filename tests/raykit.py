"""The test session's one local Ray, shared by every module that runs workers in the pytest process.

Starting Ray costs seconds of both cores here, so it is started once, on first use (``local_ray``), and
stopped when the session ends (tests/conftest.py). It declares ``LOGICAL_GPUS`` logical GPUs and
``LOGICAL_CPUS`` CPU cores whatever the machine has, so the worker layouts the tests assert (how many
timing workers, cut to the cores or oversubscribed) are the same on a laptop, a 2-core CI machine and a
64-core host. A module asks for the worker layout it wants with ``session.connect(gpus=N)``, which
reuses the running Ray. A test that needs a cluster of its own (``ray.cluster_utils.Cluster``, the
multi-node tests of the full tier) calls ``leave_local_ray`` first; the next ``local_ray`` starts the
shared one again.

This module is imported as ``raykit`` (pytest puts tests/ on sys.path for tests/conftest.py).
"""

from __future__ import annotations

import ray

from cluster import session

LOGICAL_GPUS = 4  # enough for every layout the tests ask for: 1, 2 or 4 workers, and one missing
LOGICAL_CPUS = 2  # fewer than the GPUs: CPU timing workers are cut to 2 unless oversubscribed

_ours: dict[str, str | None] = {"node": None}  # the node id of the Ray this module started


def local_ray() -> session.ClusterPlan:
    """The shared local Ray (started now if it is not running, or if a Ray of another kind is)."""
    if ray.is_initialized() and _ours["node"] != _node_id():
        ray.shutdown()  # a test's own cluster, or one a farm command in this process started
    if not ray.is_initialized():
        # as the farm starts a local Ray (session.connect), but with fixed resources, not the machine's
        session.start_local(num_gpus=LOGICAL_GPUS, num_cpus=LOGICAL_CPUS)
        _ours["node"] = _node_id()
    return session.connect(gpus=LOGICAL_GPUS, oversubscribe=True)


def leave_local_ray() -> None:
    """Disconnect from whatever Ray runs in this process (the shared one stops: this process started it)."""
    if ray.is_initialized():
        ray.shutdown()
    _ours["node"] = None


def _node_id() -> str | None:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - not connected
        return None
