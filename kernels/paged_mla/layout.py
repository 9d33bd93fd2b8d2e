"""Shared constants and dtype helpers for the paged MLA family.

Layout (FlashMLA's): q [batch, s_q, h_q, d_qk], kv_cache [num_blocks, page_size, 1, d_qk] with the first
d_v channels of every cached token also serving as V, block_table [batch, max_blocks] int32,
cache_seqlens [batch] int32, out [batch, s_q, h_q, d_v], lse [batch, h_q, s_q] fp32.

fp8 cache scale layout: `kv_scales [num_blocks, page_size]` fp32, one scale per cached token (per slot),
shared by all d_qk channels of that token. Dequantised value = kv_fp8.float() * kv_scales[block, slot].
Unused slots carry a NaN scale (and NaN fp8 bytes), so any read past a sequence's length poisons the
output.

FlashMLA's fp8 layout (kv_dtype "fp8_flashmla"): `kv_cache [num_blocks, page_size, 1, 656]` float8_e4m3fn
bytes, no separate scales. Per token: bytes 0-511 the 512 NoPE channels in fp8 e4m3, bytes 512-527 four
fp32 scales (scale t covers NoPE channels 128 t .. 128 t + 127), bytes 528-655 the 64 RoPE channels in
bf16 (not quantised): 512 + 16 + 128 = 656 B/token. Dequantised NoPE = fp8.float() x its tile's scale.
Unused slots are poisoned: NaN fp8 bytes and NaN scales.

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
    "fp8_flashmla": torch.float8_e4m3fn,
}

FLASHMLA_TILE = 128  # NoPE channels per fp32 scale
FLASHMLA_SCALE_OFFSET = D_V  # byte offset of the 4 fp32 scales inside a token
FLASHMLA_ROPE_OFFSET = D_V + 4 * (D_V // FLASHMLA_TILE)  # byte offset of the bf16 RoPE part: 528
FLASHMLA_FP8_BYTES = FLASHMLA_ROPE_OFFSET + 2 * (D_QK - D_V)  # 656


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
    """Bytes of scale metadata stored per cached token (fp32 per-token scale for fp8, else none; the
    fp8_flashmla scales live inside its 656-byte token, see kv_bytes_per_token)."""
    return 4 if name == "fp8" else 0


def kv_bytes_per_token(name: str, d_qk: int = D_QK) -> int:
    """Bytes one cached token takes: d_qk x elem size (+ 4 for fp8's per-token scale), 656 for
    fp8_flashmla (FlashMLA's accounting, so GB/s compare with its figures)."""
    if name == "fp8_flashmla":
        if d_qk != D_QK:
            raise ValueError(f"fp8_flashmla holds d_qk {D_QK} only, got {d_qk}")
        return FLASHMLA_FP8_BYTES
    return d_qk * elem_size(name) + scale_bytes_per_token(name)


def is_flashmla_fp8(kv_cache: torch.Tensor) -> bool:
    """A kv_cache tensor in FlashMLA's fp8 layout: fp8 (or raw bytes) with 656-byte tokens."""
    return kv_cache.dtype in (torch.float8_e4m3fn, torch.uint8) and kv_cache.shape[-1] == FLASHMLA_FP8_BYTES


def quantize_flashmla(x: torch.Tensor) -> torch.Tensor:
    """x [..., 576] -> [..., 656] float8_e4m3fn bytes in FlashMLA's layout: NoPE quantised per 128-channel
    tile with scale amax / 448 (NaN in, NaN scale out), RoPE rounded to bf16."""
    if x.shape[-1] != D_QK:
        raise ValueError(f"quantize_flashmla takes {D_QK} channels per token, got {x.shape[-1]}")
    lead = x.shape[:-1]
    nope = x[..., :D_V].float().reshape(*lead, D_V // FLASHMLA_TILE, FLASHMLA_TILE)
    scale = nope.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX  # [..., 4]
    q = (nope / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(*lead, D_V)
    out = torch.empty(*lead, FLASHMLA_FP8_BYTES, dtype=torch.uint8, device=x.device)
    out[..., :FLASHMLA_SCALE_OFFSET] = q.view(torch.uint8)
    out[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[..., FLASHMLA_ROPE_OFFSET:] = x[..., D_V:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out.view(torch.float8_e4m3fn)


def dequantize_flashmla(packed: torch.Tensor) -> torch.Tensor:
    """[..., 656] FlashMLA fp8 bytes -> [..., 576] fp32 (NoPE x tile scale, then RoPE)."""
    raw = packed.contiguous().view(torch.uint8)
    if raw.shape[-1] != FLASHMLA_FP8_BYTES:
        raise ValueError(f"FlashMLA fp8 tokens are {FLASHMLA_FP8_BYTES} bytes, got {raw.shape[-1]}")
    lead = raw.shape[:-1]
    nope = raw[..., :FLASHMLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET].contiguous().view(torch.float32)
    nope = (nope.reshape(*lead, -1, FLASHMLA_TILE) * scale[..., None]).reshape(*lead, D_V)
    rope = raw[..., FLASHMLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1)


def poison_flashmla(packed: torch.Tensor) -> None:
    """Make every token of a FlashMLA fp8 tensor [..., 656] unreadable: NaN fp8 bytes and NaN scales."""
    raw = packed.view(torch.uint8)
    raw.fill_(0x7F)  # e4m3fn's NaN; the RoPE bytes become large bf16 values
    raw[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET].view(torch.float32).fill_(float("nan"))


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (fp8 e4m3 [..., d], fp32 scale [...]) with x ~= fp8.float() * scale[..., None]."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.float() * scale.float()[..., None]
