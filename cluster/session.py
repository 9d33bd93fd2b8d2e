"""Connecting to Ray: start a local one (the embedded default) or join an existing cluster."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray


@dataclass
class ClusterPlan:
    """How many workers run where, and whether each owns a GPU."""

    address: str  # "local" or the address joined
    gpu: bool  # True: one actor per GPU (num_gpus=1). False: CPU slots.
    workers: int
    cuda: bool  # a real CUDA device is visible to this driver (logical GPUs on a CPU box are not)
    nodes: list[dict[str, Any]]
    threads_per_worker: int | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _init_kwargs() -> dict[str, Any]:
    # Ray's own RAY_TMPDIR decides where its session files go (tests point it at a folder they remove).
    return {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}


def connect(address: str | None = None, gpus: int | None = None) -> ClusterPlan:
    """Start or join Ray and decide the worker layout.

    Local: `gpus` logical GPUs are declared (default: the CUDA devices present). With GPUs (real or
    logical) one worker is pinned to each; with none, `gpus` (default: the CPU count) CPU workers.
    Joined: one worker per GPU in the cluster, at most `gpus`; CPU workers if it has no GPUs.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cuda = _cuda_count()
    if ray.is_initialized():
        where = "existing"
    elif address:
        ray.init(address=address, **_init_kwargs())
        where = address
    else:
        ray.init(
            num_gpus=cuda if gpus is None else (min(gpus, cuda) if cuda else gpus),
            num_cpus=os.cpu_count(),
            **_init_kwargs(),
        )
        where = "local"
    resources = ray.cluster_resources()
    nodes = [
        {
            "node_id": n["NodeID"],
            "address": n["NodeManagerAddress"],
            "gpus": int(n["Resources"].get("GPU", 0)),
            "cpus": int(n["Resources"].get("CPU", 0)),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]
    total_gpus = int(resources.get("GPU", 0))
    total_cpus = int(resources.get("CPU", 0)) or (os.cpu_count() or 1)
    if total_gpus:
        workers = min(total_gpus, gpus) if gpus else total_gpus
        threads = None if cuda else max(1, total_cpus // workers)
        note = (
            f"{workers} GPU workers (one per GPU) on {len(nodes)} node(s)"
            if cuda
            else f"no CUDA device: {workers} logical GPU workers run on the CPU, "
            f"{len(nodes)} node(s), {threads} torch thread(s) each; timings are CPU timings"
        )
        return ClusterPlan(where, True, workers, bool(cuda), nodes, threads, note)
    workers = gpus or total_cpus
    threads = max(1, total_cpus // workers)
    note = (
        f"no GPU in the cluster: {workers} CPU workers on {len(nodes)} node(s), "
        f"{threads} torch thread(s) each; timings are CPU timings"
    )
    return ClusterPlan(where, False, workers, False, nodes, threads, note)


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()
