"""Shared constants and dtype helpers for the paged MLA family.

Layout (FlashMLA's): q [batch, s_q, h_q, d_qk], kv_cache [num_blocks, page_size, 1, d_qk] with the first
d_v channels of every cached token also serving as V, block_table [batch, max_blocks] int32,
cache_seqlens [batch] int32, out [batch, s_q, h_q, d_v], lse [batch, h_q, s_q] fp32.

fp8 cache scale layout: `kv_scales [num_blocks, page_size]` fp32, one scale per cached token (per slot),
shared by all d_qk channels of that token. Dequantised value = kv_fp8.float() * kv_scales[block, slot].
Unused slots carry a NaN scale (and NaN fp8 bytes), so any read past a sequence's length poisons the
output.

Empty rows: a query row that sees no key (cache_seqlens == 0, or s_q > seqlen and the causal rule hides
every key from an early query) has out = 0 and lse = EMPTY_ROW_LSE, +inf as FlashMLA returns it (its
kernels write +inf where the softmax sum is 0). Inside the Triton kernel the partial lse of an empty split
stays -inf (the log-sum-exp of an empty set), so the combine weights it by zero; only the final lse of a
row that no split saw becomes +inf.
"""

from __future__ import annotations

import torch

D_QK = 576
D_V = 512
DEFAULT_PAGE_SIZE = 64
PAGE_SIZES = (16, 32, 64, 128)
# Unused block-table entries: far outside any pool, so an unmasked read through one faults on a GPU.
INVALID_BLOCK_ID = 2**31 - 1
EMPTY_ROW_LSE = float("inf")
FP8_MAX = 448.0

KV_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}


def kv_torch_dtype(name: str) -> torch.dtype:
    try:
        return KV_DTYPES[name]
    except KeyError:
        raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, got {name!r}") from None


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def elem_size(name: str) -> int:
    return torch.empty((), dtype=kv_torch_dtype(name)).element_size()


def scale_bytes_per_token(name: str) -> int:
    """Bytes of scale metadata stored per cached token (fp32 per-token scale for fp8, else none)."""
    return 4 if name == "fp8" else 0


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (fp8 e4m3 [..., d], fp32 scale [...]) with x ~= fp8.float() * scale[..., None]."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.float() * scale.float()[..., None]
