"""The real DeepGEMM library as a backend, when it is importable (a GPU host with deep_gemm installed).

Two public entry points are known: `fp8_gemm_nt((a, sfa), (b, sfb), d)` (newer releases) and
`gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), d)` (older ones). On SM90 both read A's fp32 1x128 scales
[M, ceil(K/128)] MN-major (stride 1 along M) with the K stride padded to a multiple of 4 floats (16 B,
what TMA needs: `tma_aligned_scales`); `fp8_gemm_nt` converts row-major scales into that layout itself,
inside every call, and passes them through untouched when they already are. So the adapter lays A's
scales out once, before the timed region (as DeepGEMM's own benchmarks do), and the timed call is the
GEMM alone. B's 128x128 block scales are used as they are (contiguous). The GEMM itself is not exercised
without a GPU; `tma_aligned_scales` is pure torch and is tested on the CPU. (On SM100 DeepGEMM wants
UE8M0-packed scales instead, which this adapter does not prepare: the farm's reference GPU is an H200.)
Scale group: this path takes fp32 scales of K granularity 128 only (its scale-layout step accepts no
other on SM90), so a trial at scale_group 64 is skipped with `scale_group_reason`'s reason, before the
library is loaded.
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


LIBRARY_SCALE_GROUP = 128


def scale_group_reason(scale_group: int) -> str | None:
    """Why the library cannot take operands quantized at `scale_group` on this path, or None."""
    if scale_group == LIBRARY_SCALE_GROUP:
        return None
    return (
        f"backend deep_gemm: its SM90 FP8 GEMM takes fp32 scales of K granularity {LIBRARY_SCALE_GROUP} "
        f"only (1x{LIBRARY_SCALE_GROUP} and {LIBRARY_SCALE_GROUP}x{LIBRARY_SCALE_GROUP}); this trial's "
        f"scale_group is {scale_group}"
    )


def load() -> Any:
    """The deep_gemm module (call after `unavailable_reason()` said None)."""
    return importlib.import_module("deep_gemm")


TMA_ALIGN_BYTES = 16


def tma_aligned_scales(sf: torch.Tensor) -> torch.Tensor:
    """fp32 scales [MN, G] laid out MN-major with the G stride rounded up to 16 bytes: strides
    (1, round_up(MN, 4)); same values, a view of a padded buffer. Returned as is when already so."""
    if sf.dim() != 2 or sf.dtype != torch.float32:
        raise ValueError(f"expected fp32 scales [MN, G], got {sf.dtype} of shape {tuple(sf.shape)}")
    mn, groups = sf.shape
    per = TMA_ALIGN_BYTES // sf.element_size()
    aligned = -(-mn // per) * per
    if sf.stride() == (1, aligned):
        return sf
    out = torch.empty_strided((mn, groups), (1, aligned), dtype=sf.dtype, device=sf.device)
    out.copy_(sf)
    return out


def make_call(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out: torch.Tensor
) -> Callable[[], object]:
    """A zero-argument callable running DeepGEMM on these operands into `out`. A's scales are laid out
    here, once (`tma_aligned_scales`), so the call does no re-layout."""
    dg = load()
    sfa = tma_aligned_scales(a_scales)
    if hasattr(dg, "fp8_gemm_nt"):
        return lambda: dg.fp8_gemm_nt((a, sfa), (b, b_scales), out)
    if hasattr(dg, "gemm_fp8_fp8_bf16_nt"):
        return lambda: dg.gemm_fp8_fp8_bf16_nt((a, sfa), (b, b_scales), out)
    raise RuntimeError(
        "backend deep_gemm: this deep_gemm has neither fp8_gemm_nt nor gemm_fp8_fp8_bf16_nt "
        f"(version {getattr(dg, '__version__', '?')})"
    )
