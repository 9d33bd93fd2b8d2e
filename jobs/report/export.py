"""Exports of stored jobs for other tools: `farm export best-configs JOB`.

The export itself belongs to the job's family (KernelFamily.best_configs: fp8_gemm writes the fastest
correct config per (N, K) and M as JSON keyed the way Triton ports key their tuned configs,
{"N=2112,K=7168": {"64": {"BLOCK_SIZE_M": 64, ..., "num_stages": 3}}}, and names the `--split-dir` files
as those ports do); this module reads the job from the store and hands its trials to the family.
"""

from __future__ import annotations

from typing import Any

from jobs.store import Store
from kernels.registry import get_family


def best_configs(store: Store, job_id: int, backend: str = "triton") -> tuple[dict[str, Any], list[str]]:
    """The job's best configs by its family's export, and the shapes without one. ValueError: no such job,
    or a family without that export."""
    job = store.get_job(job_id)
    if job is None:
        raise ValueError(f"no job {job_id} in {store.url}")
    return get_family(job.family).best_configs(store.trials(job_id), backend)


def best_configs_file(store: Store, job_id: int, key: str, device_name: str) -> str:
    """The file name the job's family gives one entry of its export."""
    job = store.get_job(job_id)
    if job is None:
        raise ValueError(f"no job {job_id} in {store.url}")
    return get_family(job.family).best_configs_file(key, device_name)
