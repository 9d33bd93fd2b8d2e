"""The compiled kernel on a GPU (native fp8 tl.dot): skipped without CUDA. The test session runs Triton in
the interpreter, so the check runs in a subprocess with TRITON_INTERPRET unset."""

from __future__ import annotations

import pytest
import torch

SCRIPT = r"""
import json
from kernels.base import TrialRequest
from kernels.fp8_gemm.case import FAMILY
from kernels.measure import MeasurePolicy
policy = MeasurePolicy(warmup_ms=5, min_samples=10, max_samples=50, max_time_s=2, seeds=3)
out = []
for shape, cfg in [
    ({"m": 64, "n": 2112, "k": 7168}, {"block_m": 64, "block_n": 128, "block_k": 128, "group_m": 8,
                                       "num_warps": 4, "num_stages": 3}),
    ({"m": 129, "n": 300, "k": 200}, {"block_m": 64, "block_n": 256, "block_k": 64, "group_m": 1,
                                      "num_warps": 8, "num_stages": 4}),
]:
    o = FAMILY.run(TrialRequest("fp8_gemm", "triton", shape, cfg, "float8_e4m3fn", policy, device="cuda"))
    out.append({"status": o.status, "error": o.error, "metrics": o.metrics, "resources": o.resources})
print(json.dumps(out))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (native fp8 tl.dot)")
def test_compiled_kernel_is_correct_and_reports_its_resources(run_compiled):
    for trial in run_compiled(SCRIPT, timeout=600):
        assert trial["status"] == "ok", trial["error"]
        assert trial["metrics"]["calc_diff"] < 1e-3
        compiled = trial["resources"]["compiled"]
        assert compiled["collected"] and compiled["n_regs"] > 0 and compiled["shared_bytes"] > 0
