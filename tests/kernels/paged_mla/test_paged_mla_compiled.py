"""Compiled evidence for the paged MLA decode (kernels.compiled): the split kernel's default config
compiles for sm_90a without spills for bf16 and fp8 caches at every page size, and a trial whose config
spills is `pruned` with the compiler's reason when compiling is asked for (TRITON_INTERPRET=0), without
running. The compiles run in a subprocess: the test session interprets Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
from kernels.base import TrialRequest
from kernels.compiled import evidence_of
from kernels.measure.policy import MeasurePolicy
from kernels.paged_mla.case import FAMILY

rows = []
for kv in ("bf16", "fp8"):
    for s_q in (1, 2):
        for page in (16, 32, 64, 128):
            shape = {"batch": 128, "seqlen": 16384, "dist": "fixed", "h_q": 128, "s_q": s_q,
                     "page_size": page, "kv_dtype": kv}
            found = evidence_of(FAMILY.meta_launch(shape, {}, "bfloat16", "triton"))
            rows.append({"shape": shape, "evidence": [e.to_dict() for e in found]})
shape = {"batch": 4, "seqlen": 4096, "dist": "fixed", "h_q": 128, "s_q": 2, "page_size": 128,
         "kv_dtype": "fp8"}
policy = MeasurePolicy(warmup_ms=0, min_samples=1, max_samples=1, max_time_s=0.1, min_time_s=0, seeds=1)
# execute, not run: run() skips the triton backend on a CPU without the interpreter before execute
# could compile anything; on a GPU host run() reaches execute and the same pruning
o = FAMILY.execute(TrialRequest("paged_mla", "triton", shape, {"block_n": 64}, "bfloat16", policy))
print(json.dumps({"rows": rows, "pruned": {"status": str(o.status), "error": o.error,
                                           "resources": o.resources, "metrics": o.metrics}}))
"""


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_INTERPRET"] = "0"  # asked for: compile, even without a GPU
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_default_configs_compile_without_spills_for_bf16_and_fp8(compiled):
    split = [
        (r["shape"], e) for r in compiled["rows"] for e in r["evidence"] if e["kernel"] == "_split_kernel"
    ]
    assert len(split) == 16
    spilling = [
        (s["kv_dtype"], s["page_size"], s["s_q"], e["regs"], e["stack"]) for s, e in split if e["spills"]
    ]
    assert not spilling, spilling  # the fp8 cache spilled ~400 B at 255 registers before
    assert all(e["shared"] <= e["smem_limit"] for _, e in split)
    assert all(e["num_warps"] == 8 and e["num_stages"] == 2 for _, e in split)


@pytest.mark.slow
def test_a_spilling_config_is_pruned_with_the_compilers_reason(compiled):
    # fp8 cache, page 128, 64-token steps: spills on sm_90a (tens of bytes at 255 registers)
    o = compiled["pruned"]
    assert o["status"] == "pruned", o
    assert o["error"].startswith("pruned: ") and "_split_kernel" in o["error"] and "spills" in o["error"]
    check = o["resources"]["compiled_check"]
    assert check["checked"] and check["target"] == "sm_90a" and check["problems"]
    assert o["metrics"]["bytes"] > 0 and "time_ns" not in o["metrics"]  # nothing ran
