"""The real DeepGEMM library as a backend, when it is importable (a GPU host with deep_gemm installed).

Two public entry points are known: `fp8_gemm_nt((a, sfa), (b, sfb), d)` (newer releases, which lay the
scales out themselves) and `gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), d)` (older ones, which want A's
scales column-major and TMA-aligned: `get_col_major_tma_aligned_tensor`). The scale re-layout is done
once, before the timed region, as DeepGEMM's own benchmarks do. Not exercised without a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


def unavailable_reason() -> str | None:
    """Why the deep_gemm backend cannot run here, or None (the family's availability check)."""
    if not torch.cuda.is_available():
        return "backend deep_gemm needs a CUDA GPU (SM90); none is available here"
    try:
        importlib.import_module("deep_gemm")
    except ImportError as exc:
        return f"backend deep_gemm: deep_gemm not installed (import failed: {exc})"
    return None


def load() -> Any:
    """The deep_gemm module (call after `unavailable_reason()` said None)."""
    return importlib.import_module("deep_gemm")


def make_call(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out: torch.Tensor
) -> Callable[[], object]:
    """A zero-argument callable running DeepGEMM on these operands into `out` (scales laid out already)."""
    dg = load()
    if hasattr(dg, "fp8_gemm_nt"):
        return lambda: dg.fp8_gemm_nt((a, a_scales), (b, b_scales), out)
    if hasattr(dg, "gemm_fp8_fp8_bf16_nt"):
        relayout = getattr(dg, "get_col_major_tma_aligned_tensor", None)
        sfa = relayout(a_scales) if relayout is not None else a_scales
        return lambda: dg.gemm_fp8_fp8_bf16_nt((a, sfa), (b, b_scales), out)
    raise RuntimeError(
        "backend deep_gemm: this deep_gemm has neither fp8_gemm_nt nor gemm_fp8_fp8_bf16_nt "
        f"(version {getattr(dg, '__version__', '?')})"
    )
