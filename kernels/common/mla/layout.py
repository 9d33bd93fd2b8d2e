"""Shared constants and dtype helpers for the paged MLA family.

Layout (FlashMLA's): q [batch, s_q, h_q, d_qk], kv_cache [num_blocks, page_size, 1, d_qk] with the first
d_v channels of every cached token also serving as V, block_table [batch, max_blocks] int32,
cache_seqlens [batch] int32, out [batch, s_q, h_q, d_v], lse [batch, h_q, s_q] fp32.

Page size: any integer from 1 to MAX_PAGE_SIZE tokens. The Triton kernel looks every token's page up in
the block table on its own, so its tile (a power of two) need not divide the page; PAGE_SIZES are the
sizes the shipped specs measure (and the compiled-register tests cover).

fp8 cache scale layout: `kv_scales [num_blocks, page_size]` fp32, one scale per cached token (per slot),
shared by all d_qk channels of that token. Dequantised value = kv_fp8.float() * kv_scales[block, slot].
Unused slots carry a NaN scale (and NaN fp8 bytes), so any read past a sequence's length poisons the
output.

FlashMLA's fp8 layout (kv_dtype "fp8_flashmla", its V3.2 cache) with FlashMLA's conventions:
`kv_cache [num_blocks, page_size, 1, 656]` float8_e4m3fn bytes, no separate scales. Per token: bytes
0-511 the 512 NoPE channels in fp8 e4m3, bytes 512-527 four fp32 scales (scale t covers NoPE channels
128 t .. 128 t + 127), bytes 528-655 the 64 RoPE channels in bf16 (not quantised): 512 + 16 + 128 =
656 B/token. Every scale is a power of two, as FlashMLA's quantiser writes it: 2 ** ceil(log2(max(amax /
448, 1e-4))) with amax the tile's largest |value| in fp32, and the fp8 value is x / scale rounded to e4m3.
Dequantised NoPE = fp8 x its tile's scale stored in bf16, exact because the scale is a power of two, so
the reference (fp32 math on those bf16 values) and the kernels (bf16 tensor-core operands) read the same K.
Unused slots are poisoned: NaN fp8 bytes and NaN scales.

Empty rows: kernels.common.lse holds the convention (re-exported here as EMPTY_ROW_LSE): a query row that
sees no key (cache_seqlens == 0, or s_q > seqlen and the causal rule hides every key from an early query)
has out = 0 and lse = +inf, as FlashMLA returns it; lse is a natural log. Inside the Triton kernel the
partial lse of an empty split stays -inf (the log-sum-exp of an empty set), so the combine weights it by
zero; only the final lse of a row that no split saw becomes +inf.
"""

from __future__ import annotations

import torch

# Re-exported: the family's modules and tests import it from here (kernels.common.lse is the convention).
from kernels.common.lse import EMPTY_ROW_LSE as EMPTY_ROW_LSE

D_QK = 576
D_V = 512
DEFAULT_PAGE_SIZE = 64
PAGE_SIZES = (16, 32, 64, 128)  # the page sizes the shipped specs measure
MAX_PAGE_SIZE = 1024  # any page size from 1 to this is accepted
# Unused block-table entries: far outside any pool, so an unmasked read through one faults on a GPU.
INVALID_BLOCK_ID = 2**31 - 1
FP8_MAX = 448.0
FLASHMLA_MIN_SCALE = 1e-4  # FlashMLA's floor on amax / 448 before it rounds the scale up to a power of two

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


def flashmla_scales(nope: torch.Tensor) -> torch.Tensor:
    """[..., 512] NoPE channels -> [..., 4] fp32 power-of-two scales, one per 128-channel tile, as
    FlashMLA's quantiser computes them: 2 ** ceil(log2(max(amax / 448, 1e-4))) (NaN in, NaN out)."""
    tiles = nope.float().reshape(*nope.shape[:-1], -1, FLASHMLA_TILE)
    ratio = tiles.abs().amax(dim=-1) / FP8_MAX
    return torch.exp2(torch.ceil(torch.log2(ratio.clamp(min=FLASHMLA_MIN_SCALE))))


def quantize_flashmla(x: torch.Tensor) -> torch.Tensor:
    """x [..., 576] -> [..., 656] float8_e4m3fn bytes in FlashMLA's layout, bit for bit what its quantiser
    writes: NoPE divided by its tile's power-of-two scale (flashmla_scales) and rounded to e4m3, the fp32
    scales, RoPE rounded to bf16."""
    if x.shape[-1] != D_QK:
        raise ValueError(f"quantize_flashmla takes {D_QK} channels per token, got {x.shape[-1]}")
    lead = x.shape[:-1]
    nope = x[..., :D_V].float().reshape(*lead, D_V // FLASHMLA_TILE, FLASHMLA_TILE)
    scale = flashmla_scales(x[..., :D_V])  # [..., 4]
    q = (nope / scale[..., None]).to(torch.float8_e4m3fn).reshape(*lead, D_V)
    out = torch.empty(*lead, FLASHMLA_FP8_BYTES, dtype=torch.uint8, device=x.device)
    out[..., :FLASHMLA_SCALE_OFFSET] = q.view(torch.uint8)
    out[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[..., FLASHMLA_ROPE_OFFSET:] = x[..., D_V:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out.view(torch.float8_e4m3fn)


def dequantize_flashmla(packed: torch.Tensor) -> torch.Tensor:
    """[..., 656] FlashMLA fp8 bytes -> [..., 576] bf16, as FlashMLA dequantises: NoPE = fp8 x its tile's
    scale (computed in fp32, exact in bf16 for the power-of-two scales quantize_flashmla writes), then the
    bf16 RoPE. The Triton kernel forms the same bf16 values (kernels.common.mla.triton_decode)."""
    raw = packed.contiguous().view(torch.uint8)
    if raw.shape[-1] != FLASHMLA_FP8_BYTES:
        raise ValueError(f"FlashMLA fp8 tokens are {FLASHMLA_FP8_BYTES} bytes, got {raw.shape[-1]}")
    lead = raw.shape[:-1]
    nope = raw[..., :FLASHMLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[..., FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET].contiguous().view(torch.float32)
    nope = (nope.reshape(*lead, -1, FLASHMLA_TILE) * scale[..., None]).reshape(*lead, D_V)
    rope = raw[..., FLASHMLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16)
    return torch.cat([nope.to(torch.bfloat16), rope], dim=-1)


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
