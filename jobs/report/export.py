"""Exports of stored jobs for other tools: `farm export best-configs JOB`.

The fastest correct config per (N, K) and M as JSON keyed the way Triton ports key their tuned configs,
{"N=2112,K=7168": {"64": {"BLOCK_SIZE_M": 64, ..., "num_stages": 3}}}; `--split-dir` writes one file
per (N, K) named as those ports name them. The FP8-specific part lives with its family
(kernels.fp8_gemm.export); this module reads the job from the store.
"""

from __future__ import annotations

from typing import Any

from jobs.store.repository import Store
from kernels.fp8_gemm.export import best_configs as fp8_best_configs
from kernels.fp8_gemm.export import port_file_name as port_file_name


def best_configs(store: Store, job_id: int, backend: str = "triton") -> tuple[dict[str, Any], list[str]]:
    """The job's best FP8 GEMM tile configs (kernels.fp8_gemm.export), and the shapes without one."""
    if store.get_job(job_id) is None:
        raise ValueError(f"no job {job_id} in {store.url}")
    return fp8_best_configs(store.trials(job_id), backend)
