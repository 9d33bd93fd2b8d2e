"""A program for Nsight Compute to profile: builds one shape's inputs and launches the Triton kernel.

  python -m kernels.fp8_gemm.profile_target '{"m": 64, "n": 2112, "k": 7168}' '{"block_m": 64, ...}'
(the shape may name its scale_group, as a trial's does).
The first launch compiles (skip it with ncu --launch-skip 1); the second is the one profiled.
"""

from __future__ import annotations

import json
import sys

import torch

from kernels.fp8_gemm.inputs import build_inputs
from kernels.fp8_gemm.quant import GROUP
from kernels.fp8_gemm.tiles import TileConfig
from kernels.fp8_gemm.triton_gemm import fp8_gemm


def main(argv: list[str]) -> int:
    shape, config = json.loads(argv[0]), json.loads(argv[1])
    group = shape.get("scale_group", GROUP)
    x = build_inputs(shape["m"], shape["n"], shape["k"], seed=0, device="cuda", scale_group=group)
    cfg = TileConfig.from_dict(config)
    for _ in range(2):
        fp8_gemm(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg, scale_group=group)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
