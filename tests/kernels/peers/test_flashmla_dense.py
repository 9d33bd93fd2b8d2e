"""The paged MLA family against FlashMLA's dense decode and its V3.2 fp8 cache, on FlashMLA's own terms.

The peers below are written here, independently of kernels.paged_mla, from what FlashMLA's tests define:
  - the V3.2 fp8 cache (656 bytes a token): 512 NoPE channels in fp8 e4m3, four fp32 scales (one per 128
    channels), the 64 RoPE channels in bf16. A tile's scale is a power of two, 2 ** ceil(log2(max(amax /
    448, 1e-4))) with amax its largest |value| in fp32; the fp8 value is x / scale in fp32 rounded to e4m3.
    Dequantised: fp8 x scale stored in bf16 (exact, the scale being a power of two), RoPE as stored.
  - the dense decode reference: per sequence the first cache_seqlens[b] tokens through the block table,
    NaN in them zeroed, fp32 math from the bf16 values, scores / sqrt(576), causal mask tril(diagonal =
    s_k - s_q) when s_q > 1; a query row with no visible key ("lonely") gets out 0 and lse +inf; lse is the
    natural log.
  - its test data: q and K drawn as randn / 10 clamped to [-1, 1] in bf16, block tables shuffled, every
    slot past a sequence's length NaN, unused block-table entries 2147480000.
Compared: the project's quantiser (bytes, bit for bit) and dequantiser, the cache manager's pages, the
project's reference and its Triton kernel (interpreter: tests/conftest.py sets TRITON_INTERPRET) by
FlashMLA's rule (kernels.common.mla.check), for bf16 and fp8 caches, on several batches with odd lengths,
zero-length sequences, page boundaries, s_q > 1 with lonely rows, NaN-poisoned unused slots, and on the
family's unit-spread inputs as well as FlashMLA's.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.common.mla.cache import PagedKVCache
from kernels.common.mla.check import check_decode
from kernels.common.mla.layout import dequantize_flashmla, quantize_flashmla
from kernels.common.mla.reference import mla_decode_reference
from kernels.common.mla.triton_decode import mla_decode_triton
from kernels.paged_mla.inputs import build_decode_inputs

D, DV, TILE = 576, 512, 128
UNUSED_ENTRY = 2147480000  # what FlashMLA's dense test writes into unused block-table entries
FP8 = torch.float8_e4m3fn


# -- the peers -------------------------------------------------------------------------------------------


def pow2_from_exponent(e: torch.Tensor) -> torch.Tensor:
    """2 ** e for integral fp32 e, built from the exponent bits (NaN stays NaN)."""
    bits = (e.nan_to_num(0.0).to(torch.int32) + 127) << 23
    return torch.where(e.isnan(), float("nan"), bits.view(torch.float32))


def v32_quantize(k: torch.Tensor) -> torch.Tensor:
    """[..., 576] -> [..., 656] uint8: FlashMLA's V3.2 fp8 token, tile by tile."""
    nope, scales = [], []
    for t in range(DV // TILE):
        tile = k[..., t * TILE : (t + 1) * TILE]
        ratio = tile.abs().amax(dim=-1).float() / 448.0
        scale = pow2_from_exponent(torch.ceil(torch.log2(torch.clamp_min(ratio, 1e-4))))
        nope.append((tile.float() / scale[..., None]).to(FP8).view(torch.uint8))
        scales.append(scale)
    scale_bytes = torch.stack(scales, dim=-1).contiguous().view(torch.uint8)
    rope_bytes = k[..., DV:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([*nope, scale_bytes, rope_bytes], dim=-1)


def v32_dequantize(packed: torch.Tensor) -> torch.Tensor:
    """[..., 656] -> [..., 576] bf16: fp8 x its tile's scale written into bf16, RoPE as stored."""
    raw = packed.view(torch.uint8)
    out = torch.empty(*raw.shape[:-1], D, dtype=torch.bfloat16)
    scales = raw[..., DV : DV + 16].contiguous().view(torch.float32)
    for t in range(DV // TILE):
        fp8 = raw[..., t * TILE : (t + 1) * TILE].contiguous().view(FP8)
        out[..., t * TILE : (t + 1) * TILE] = fp8.float() * scales[..., t : t + 1]
    out[..., DV:] = raw[..., DV + 16 :].contiguous().view(torch.bfloat16)
    return out


def dense_reference(
    seqlens: torch.Tensor, block_table: torch.Tensor, q: torch.Tensor, blocked_k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense decode semantics: q [b, s_q, h_q, 576], blocked_k [blocks, page, 1, 576] ->
    (out [b, s_q, h_q, 512] fp32, lse [b, h_q, s_q] fp32)."""
    b, s_q, h_q, _ = q.shape
    page = blocked_k.shape[1]
    out = torch.empty(b, s_q, h_q, DV)
    lse = torch.empty(b, h_q, s_q)
    for i in range(b):
        n = int(seqlens[i])
        blocks = block_table[i, : -(-n // page)].long()
        kv = blocked_k[blocks].reshape(-1, D)[:n].float()
        kv[kv != kv] = 0.0
        w = q[i].transpose(0, 1).float() @ kv.T  # [h_q, s_q, n]
        if s_q > 1:
            seen = torch.ones(s_q, n, dtype=torch.bool).tril(diagonal=n - s_q)
            w = w.masked_fill(~seen, float("-inf"))
        w = w / math.sqrt(D)
        row_lse = w.logsumexp(dim=-1)
        o = torch.softmax(w, dim=-1) @ kv[:, :DV]
        lonely = row_lse == float("-inf")
        o[lonely] = 0.0
        row_lse[lonely] = float("inf")
        out[i] = o.transpose(0, 1)
        lse[i] = row_lse
    return out, lse


@dataclass
class Case:
    q: torch.Tensor
    blocked_k: torch.Tensor  # bf16, NaN past every sequence's length
    block_table: torch.Tensor
    seqlens: torch.Tensor

    def cache(self, kv_dtype: str) -> torch.Tensor:
        """bf16, FlashMLA's fp8 bytes quantised by the peer ("fp8_flashmla") or by the project's quantiser
        ("fp8_flashmla/project": what the family's caches hold)."""
        if kv_dtype == "bf16":
            return self.blocked_k
        if kv_dtype == "fp8_flashmla/project":
            return quantize_flashmla(self.blocked_k)
        return v32_quantize(self.blocked_k).view(FP8)

    def peer(self, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.blocked_k if kv_dtype == "bf16" else v32_dequantize(self.cache(kv_dtype))
        return dense_reference(self.seqlens, self.block_table, self.q, k)


def make_case(lens: list[int], *, h_q: int, s_q: int, page: int, spread: str, seed: int) -> Case:
    """FlashMLA's test data ("flashmla": randn / 10 clamped to [-1, 1]) or the family's ("unit": randn)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    per_seq = -(-max(lens) // page) + 1
    table = torch.randperm(b * per_seq, generator=g).view(b, per_seq).to(torch.int32)

    def draw(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, generator=g)
        return (x / 10).clamp(-1.0, 1.0) if spread == "flashmla" else x

    q = draw(b, s_q, h_q, D).to(torch.bfloat16)
    k = draw(b * per_seq, page, 1, D).to(torch.bfloat16)
    for i, n in enumerate(lens):
        used = -(-n // page)
        k[table[i, used:].long()] = float("nan")
        if n % page:
            k[table[i, used - 1], n % page :] = float("nan")
        table[i, used:] = UNUSED_ENTRY
    return Case(q, k, table, torch.tensor(lens, dtype=torch.int32))


# -- the fp8 cache ---------------------------------------------------------------------------------------


def edge_tokens() -> torch.Tensor:
    """Tokens whose tiles hit the quantiser's corners, as fp32."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, D, generator=g)
    x[0, :TILE] = 0.0  # amax 0: the 1e-4 floor, scale 2^-13
    x[1, :TILE] *= 1e-7  # amax / 448 under the floor
    x[2, :TILE] = 0.5
    x[2, 5] = -448.0 * 2.0**-3  # amax / 448 exactly a power of two (and negative)
    x[3, TILE : 2 * TILE] *= 1e4  # large values
    x[4, 2 * TILE : 3 * TILE] = torch.linspace(-3, 3, TILE)
    x[5] *= 2.0**-20
    x[6, :DV] = x[6, :DV].sign() * 448.0  # every NoPE value at e4m3's largest magnitude
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantiser_writes_flashmlas_bytes_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    blocks = (torch.randn(3, 16, 1, D, generator=g) * torch.logspace(-3, 2, 16)[None, :, None, None]).to(
        dtype
    )
    for x in (edge_tokens().to(dtype), blocks):
        mine = quantize_flashmla(x)
        assert mine.dtype == FP8 and mine.shape == (*x.shape[:-1], 656)
        assert torch.equal(mine.view(torch.uint8), v32_quantize(x))


def test_dequantiser_is_flashmlas():
    packed = v32_quantize(torch.cat([edge_tokens(), torch.randn(32, D) * 5]))
    packed[3].fill_(0x7F)  # a poisoned token: NaN bytes (and a NaN scale)
    mine = dequantize_flashmla(packed.view(FP8))
    assert mine.dtype == torch.bfloat16
    torch.testing.assert_close(mine, v32_dequantize(packed), rtol=0, atol=0, equal_nan=True)


def test_cache_manager_pages_hold_flashmlas_bytes():
    g = torch.Generator().manual_seed(2)
    kv = [torch.randn(n, D, generator=g).to(torch.bfloat16) for n in (37, 16, 1)]
    cache = PagedKVCache(8, 16, kv_dtype="fp8_flashmla", page_order=[5, 2, 7, 0, 3, 6, 1, 4])
    for i, x in enumerate(kv):
        cache.add_sequence(i, list(range(100 * i, 100 * i + len(x))), x)
    t = cache.kernel_inputs([0, 1, 2])
    raw = t.kv_cache.view(torch.uint8)
    for i, x in enumerate(kv):
        pos = torch.arange(len(x))
        slots = raw[t.block_table[i, pos // 16].long(), pos % 16, 0]
        assert torch.equal(slots, v32_quantize(x))
    unused = raw[t.block_table[0, 2].long(), 5:, 0, DV : DV + 16].contiguous().view(torch.float32)
    assert unused.isnan().all()  # the rest of the last page is poisoned


# -- the decode ------------------------------------------------------------------------------------------

CASES = {
    "odd lengths": dict(lens=[37, 1, 100, 23], h_q=4, s_q=1, page=16),
    "causal s_q 3, lonely rows": dict(lens=[1, 2, 50, 3], h_q=4, s_q=3, page=16),
    "zero lengths": dict(lens=[0, 5, 0], h_q=2, s_q=2, page=64),
    "page boundaries": dict(lens=[63, 64, 65, 129], h_q=2, s_q=2, page=64),
    "page 61": dict(lens=[61, 62, 130], h_q=2, s_q=2, page=61),
}


KV_DTYPES = ["bf16", "fp8_flashmla", "fp8_flashmla/project"]


def _case(name: str, spread: str) -> Case:
    return make_case(**CASES[name], spread=spread, seed=sorted(CASES).index(name))


def _project_args(case: Case, kv_dtype: str) -> tuple[torch.Tensor, ...]:
    return case.q, case.cache(kv_dtype), case.block_table, case.seqlens


@pytest.mark.parametrize("spread", ["flashmla", "unit"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_is_flashmlas_dense_decode(name, kv_dtype, spread):
    case = _case(name, spread)
    out, lse = mla_decode_reference(*_project_args(case, kv_dtype))
    peer_out, peer_lse = case.peer(kv_dtype)
    res = check_decode(out, lse, peer_out, peer_lse)  # fp32 against fp32: FlashMLA's rule, nothing rounded
    assert res.passed, res.message
    if name in ("causal s_q 3, lonely rows", "zero lengths"):
        assert torch.isposinf(peer_lse).any()  # the case has lonely rows
    assert (
        torch.equal(torch.isposinf(lse), torch.isposinf(peer_lse))
        and (out[torch.isposinf(lse).transpose(1, 2)] == 0).all()
    )


@pytest.mark.parametrize("spread", ["flashmla", "unit"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_is_flashmlas_dense_decode(name, kv_dtype, spread):
    case = _case(name, spread)
    out, lse = mla_decode_triton(*_project_args(case, kv_dtype), num_sms=8)
    assert out.dtype == torch.bfloat16
    res = check_decode(out, lse, *case.peer(kv_dtype))  # the peer's fp32 out rounded to bf16, as FlashMLA
    assert res.passed, res.message


def test_issue_43_case_reference_within_flashmlas_tolerance():
    # the family's own fp8_flashmla cache: the reference read the bytes with FlashMLA's dequantisation
    # must agree with the project's reference; with amax / 448 scales it was 4.55e-3 off in lse
    inp = build_decode_inputs(
        [1, 15, 16, 17, 70], h_q=16, s_q=2, page_size=16, kv_dtype="fp8_flashmla", seed=3
    )
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = mla_decode_reference(*args)
    peer_out, peer_lse = dense_reference(
        inp.cache_seqlens, inp.block_table, inp.q, v32_dequantize(inp.kv_cache)
    )
    res = check_decode(out, lse, peer_out, peer_lse)
    assert res.passed, res.message
    assert res.lse.max_abs_err < 1e-5 and res.out.max_abs_err < 1e-5
