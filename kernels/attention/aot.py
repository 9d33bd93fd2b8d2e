"""Compile the attention kernels for an SM90 target without a GPU, and report their static resources.

    python -m kernels.attention.aot            (TRITON_INTERPRET must be unset: it replaces @triton.jit)

Triton ships ptxas, so the GPU code path (bf16 tensor-core dots, the constexpr branches the interpreter
never takes) can be compiled and checked on any machine. For each kernel and tile config this prints
the shared memory from the compile metadata, registers and spill stack from `cuobjdump
--dump-resource-usage` on the cubin, and the theoretical occupancy (kernels.measure.resources). On a
GPU the case reports the same from the launched kernel; this is the CPU-side early warning.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.measure.resources import occupancy

TARGET = GPUTarget("cuda", 90, 32)
_POINTERS = {"lens_ptr": "*i32", "idx_ptr": "*i32", "lse_ptr": "*fp32", "po_ptr": "*fp32", "pl_ptr": "*fp32"}


@dataclass(frozen=True)
class KernelConfig:
    kernel: str  # "prefill" | "decode" | "sparse" | "combine"
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    dtype: str = "bf16"


def _kernel(name: str) -> Any:
    if name == "prefill":
        from kernels.attention.triton_prefill import _flash_fwd_kernel as fn
    elif name == "decode":
        from kernels.attention.triton_decode import _decode_split_kernel as fn
    elif name == "sparse":
        from kernels.attention.triton_sparse import _sparse_kernel as fn
    elif name == "combine":
        from kernels.attention.triton_decode import _decode_combine_kernel as fn
    else:
        raise ValueError(f"unknown kernel {name!r}")
    if not hasattr(fn, "arg_names"):
        raise RuntimeError("TRITON_INTERPRET is set: the kernels are interpreted, not compiled")
    return fn


def compile_config(cfg: KernelConfig) -> Any:
    fn = _kernel(cfg.kernel)
    signature = {}
    for name in fn.arg_names:
        if name in cfg.constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = _POINTERS.get(name, f"*{cfg.dtype}")
        else:
            signature[name] = "fp32" if name == "sm_scale_log2" else "i32"
    consts = {(fn.arg_names.index(k),): v for k, v in cfg.constexprs.items()}
    src = ASTSource(fn, signature, constexprs=consts)
    return triton.compile(
        src, target=TARGET, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    )


def resource_usage(compiled: Any) -> dict[str, int]:
    """Registers per thread and spill stack bytes from the cubin (cuobjdump ships with Triton)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if match is None:
        raise RuntimeError(f"no resource usage in cuobjdump output: {text[-300:]}")
    return {"regs": int(match.group(1)), "stack": int(match.group(2))}


def report(cfg: KernelConfig) -> dict[str, Any]:
    compiled = compile_config(cfg)
    usage = resource_usage(compiled)
    shared = int(compiled.metadata.shared)
    occ = occupancy(usage["regs"], shared, cfg.num_warps)
    return {"shared_bytes": shared, **usage, "occupancy": occ["occupancy"], "limiter": occ["limiter"]}


def _dims(d1: int, d2: int, dv: int, bm: int, bn: int, v_in_k: bool = False) -> dict[str, Any]:
    return dict(
        D1=d1, D2=d2, BLOCK_D2=max(16, triton.next_power_of_2(max(d2, 1))), DV=dv,
        BLOCK_DV=triton.next_power_of_2(dv), BLOCK_M=bm, BLOCK_N=bn, F32=False, V_IN_K=v_in_k,
    )  # fmt: skip


# The default tiles of the spec's main shapes (GQA d 128, MLA latent 576/512).
DEFAULT_CONFIGS = [
    KernelConfig(
        "prefill", {**_dims(128, 0, 128, 64, 64), "CAUSAL": True, "HAS_LENS": False, "CAUSAL_SHIFT": 0}
    ),
    KernelConfig("decode", {**_dims(128, 0, 128, 16, 64), "CAUSAL": True, "HAS_LENS": False}),
    KernelConfig("decode", {**_dims(512, 64, 512, 32, 64, True), "CAUSAL": True, "HAS_LENS": True}, 8),
    KernelConfig("sparse", {**_dims(512, 64, 512, 32, 64, True), "HAS_LENS": False}, 8),
    KernelConfig("combine", {"DV": 512, "BLOCK_DV": 512, "BLOCK_S": 32}),
]


def main() -> int:
    for cfg in DEFAULT_CONFIGS:
        tiles = {k: v for k, v in cfg.constexprs.items() if k in ("D1", "D2", "DV", "BLOCK_M", "BLOCK_N")}
        print(f"{cfg.kernel:8s} warps={cfg.num_warps} {tiles}: {report(cfg)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
