"""The long-lived worker actor: one per GPU (num_gpus=1, num_cpus=0), or one per logical CPU slot.

A worker imports kernel families on demand, runs one trial per call and returns the outcome with
where it ran. A worker started for a job's shipped source (cluster.shipping) puts that kernels/ first
on its import path before anything imports ``kernels`` (this module imports it only inside the worker).
A family that raises is an `error` outcome; a worker process that dies (segfault, OOM, os._exit)
surfaces in the driver as an actor error and is handled there.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from cluster import environment
from cluster.shipping import source_digest, unpack_kernels

if TYPE_CHECKING:
    from kernels.base import TrialOutcome, TrialRequest


@dataclasses.dataclass
class WorkerResult:
    """One trial as it comes back from a worker: the family's outcome and when it ran (epoch seconds;
    None when the framework failed before the trial started)."""

    outcome: TrialOutcome
    started: float | None = None
    finished: float | None = None


def normal_priority() -> int:
    """Raise this worker process back to niceness 0 if it runs nicer (a cluster started without
    `RAY_worker_niceness=0`: Ray's default is 15, which makes CPU timings yield to every other process;
    cluster.session.start_local says why). Allowed for root and CAP_SYS_NICE; elsewhere it stays as it
    is. Returns the niceness the worker times at."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:  # not permitted: timings keep the cluster's niceness
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def load_shipped(digest: str, archive: bytes) -> Path:
    """Make `import kernels` load the shipped source of that digest (extracted once per node under the
    Ray temp folder); returns the folder put first on sys.path."""
    root = unpack_kernels(digest, archive, _sources_dir())
    for name in [m for m in sys.modules if m == "kernels" or m.startswith("kernels.")]:
        del sys.modules[name]  # a module imported before (none in a fresh actor) would shadow the shipped one
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return root


def _sources_dir() -> Path:
    d = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "kernelfarm-sources"
    d.mkdir(parents=True, exist_ok=True)
    return d


class FarmWorker:
    def __init__(
        self, slot: str, threads: int | None = None, digest: str | None = None, archive: bytes | None = None
    ):
        self.source = digest  # the shipped kernels/ it runs (None: the cluster's own)
        if digest is not None and archive is not None:
            load_shipped(digest, archive)
        import torch

        import kernels
        from kernels import measure

        self.kernels_path = str(Path(kernels.__file__).parent)
        self.niceness = normal_priority()
        measure.load_all()  # before the first trial: no trial pays for importing the timing core
        if not torch.cuda.is_available():
            # No GPU: Triton backends run in the interpreter. Must be set before any family imports triton.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if threads:
            torch.set_num_threads(threads)
        self.slot = slot
        self.node_id = ray.get_runtime_context().get_node_id()
        # IP plus a short node id: several Ray nodes can share one host (and one IP)
        self.node = f"{ray.util.get_node_ip_address()}/{self.node_id[:6]}"
        gpu_ids = ray.get_gpu_ids()
        self.gpu_id = ",".join(str(g) for g in gpu_ids) if gpu_ids else None
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # the kernel source it runs: the shipped digest, or the same digest of the cluster's own kernels/
        own = self.source or source_digest(Path(self.kernels_path))
        self.env = environment.collect(threads, kernels_source=own)

    def info(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "node": self.node,
            "node_id": self.node_id,
            "gpu_id": self.gpu_id,
            "device": self.device,
            "pid": os.getpid(),
            "niceness": self.niceness,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "environment": self.env,
            "source": self.source,
            "kernels_path": self.kernels_path,
        }

    def run_batch(self, payload: bytes) -> bytes:
        """Run pickled TrialRequests one after another; return their pickled results.

        Pickled bytes cross Ray several times faster than the same objects (its serializer walks
        custom classes in pure Python), which matters for the dispatch overhead of short trials.
        """
        return pickle.dumps([self.run(r) for r in pickle.loads(payload)])

    def run(self, request: TrialRequest) -> WorkerResult:
        from kernels.base import TrialOutcome, TrialStatus
        from kernels.registry import get_family

        request = dataclasses.replace(request, device=self.device)
        started = time.time()
        try:
            outcome = get_family(request.family).run(request)
        except Exception:  # noqa: BLE001 - any failure of the kernel code is this trial's error
            outcome = TrialOutcome(status=TrialStatus.ERROR, error=traceback.format_exc(limit=20))
        return WorkerResult(outcome, started, time.time())


RemoteWorker = ray.remote(max_restarts=0, max_task_retries=0)(FarmWorker)
