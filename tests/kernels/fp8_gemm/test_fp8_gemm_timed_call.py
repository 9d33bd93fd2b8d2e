"""The FP8 GEMM backends' timed calls run the kernel and nothing else (issue 30): DeepGEMM's A-scale
re-layout (`tma_aligned_scales`) happens once in `make_call`, and the Triton backend's operand checks and
allocation once in `prepare`. On a CPU, DeepGEMM itself is stood in for by a recorder of its entry point
(the library needs a Hopper GPU): what is asserted is what the farm times around it."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from types import SimpleNamespace

import torch

from kernels.fp8_gemm import deep_gemm_adapter
from kernels.fp8_gemm.inputs import build_inputs
from kernels.measure.clean_call import torch_calls, transfers


def test_the_deep_gemm_call_does_no_relayout(monkeypatch):
    seen: list[tuple] = []
    monkeypatch.setattr(
        deep_gemm_adapter, "load", lambda: SimpleNamespace(fp8_gemm_nt=lambda *a: seen.append(a))
    )
    x = build_inputs(8, 16, 256, seed=0, device=torch.device("cpu"))
    out = torch.empty((8, 16), dtype=torch.bfloat16)
    call = deep_gemm_adapter.make_call(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, out)
    assert torch_calls(call) == []  # a re-layout inside the call would show its transpose / copy here
    ((a_pair, _b_pair, got_out),) = seen
    sfa = a_pair[1]
    assert sfa.stride() == deep_gemm_adapter.tma_aligned_scales(x.a_scales).stride()  # laid out before
    assert torch.equal(sfa, x.a_scales) and got_out is out and transfers(call) == []


def test_the_triton_call_launches_the_kernel_only():
    from kernels.fp8_gemm import triton_gemm
    from kernels.fp8_gemm.tiles import TileConfig

    x = build_inputs(16, 32, 128, seed=0, device=torch.device("cpu"))
    cfg = TileConfig(block_m=16, block_n=32, block_k=128, group_m=1, num_warps=4, num_stages=1)
    _out, launch = triton_gemm.prepare(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg)
    launch()  # compiles (the interpreter: nothing to compile)
    forming = {"empty", "empty_strided", "copy_", "contiguous", "to", "t", "transpose", "clone", "zeros"}
    made = [c for c in torch_calls(launch) if c in forming]
    assert made == []  # no allocation, copy or re-layout inside the timed call
