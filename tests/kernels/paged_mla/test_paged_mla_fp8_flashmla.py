"""FlashMLA's 656 B/token fp8 cache: quantisation round trip, the cache manager and reference reading it,
the Triton kernel reading it (interpreter), and the cost model counting 656 bytes per token."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.common.mla.check import check_decode
from kernels.common.mla.cost import mla_decode_cost
from kernels.common.mla.layout import (
    D_QK,
    D_V,
    FLASHMLA_FP8_BYTES,
    dequantize_flashmla,
    kv_bytes_per_token,
    quantize_flashmla,
)
from kernels.common.mla.reference import mla_decode_reference
from kernels.common.mla.triton_decode import mla_decode_triton
from kernels.paged_mla.case import FAMILY
from kernels.paged_mla.inputs import build_decode_inputs
from testkit.kernels.broken import overreading_decode


def test_layout_is_656_bytes_with_scales_and_bf16_rope_where_flashmla_puts_them():
    assert FLASHMLA_FP8_BYTES == 512 + 4 * 4 + 64 * 2 == 656
    x = torch.randn(3, D_QK, generator=torch.Generator().manual_seed(0))
    x[:, 128:256] *= 100  # tile 1 has its own, larger scale
    x[2, 384:512] = 0  # an all-zero tile: amax / 448 floored at 1e-4, then rounded up to 2^-13
    packed = quantize_flashmla(x)
    assert packed.shape == (3, 656) and packed.dtype == torch.float8_e4m3fn
    raw = packed.view(torch.uint8)
    scales = raw[:, 512:528].contiguous().view(torch.float32)
    amax = x[:, :512].reshape(3, 4, 128).abs().amax(-1)
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all()  # powers of two, as FlashMLA's quantiser writes them
    assert (scales >= amax / 448).all() and (scales < 2 * (amax / 448).clamp(min=1e-4)).all()
    assert scales[2, 3] == 2.0**-13 and (raw[2, 384:512] == 0).all()
    # 100x the amax; each scale rounded up to a power of two (less than 2x): at least ~50x, whatever the draw
    assert scales[0, 1] >= 32 * scales[0, 0]
    assert torch.equal(raw[:, 528:].contiguous().view(torch.bfloat16), x[:, 512:].to(torch.bfloat16))


def test_scales_are_powers_of_two_so_the_bf16_dequantisation_is_exact():
    x = torch.randn(256, D_QK, generator=torch.Generator().manual_seed(4)) * 3
    packed = quantize_flashmla(x)
    back = dequantize_flashmla(packed)
    assert back.dtype == torch.bfloat16
    raw = packed.view(torch.uint8)
    fp8 = raw[:, :512].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, 4, 128)
    exact = (fp8 * raw[:, 512:528].contiguous().view(torch.float32)[..., None]).reshape(-1, 512)
    assert torch.equal(back[:, :512].float(), exact)  # fp32 product == its bf16 rounding


def test_round_trip_against_the_bf16_cache_is_within_fp8_tolerance():
    x = torch.randn(64, D_QK, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).float()
    packed = quantize_flashmla(x)
    back = dequantize_flashmla(packed).float()
    assert back.shape == x.shape
    assert torch.equal(back[:, D_V:], x[:, D_V:])  # RoPE stays bf16: exact
    scale = packed.view(torch.uint8)[:, 512:528].contiguous().view(torch.float32)[..., None]
    err = (back[:, :D_V] - x[:, :D_V]).reshape(64, 4, 128).abs()
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value, and values below the smallest normal
    # step are off by at most half a subnormal step (2^-10 of the tile's scale)
    assert (err <= x[:, :D_V].reshape(64, 4, 128).abs() / 16 + scale * 2**-10).all()
    assert (err > 0).any()  # it really was quantised


def test_cache_reference_and_cost_use_the_layout():
    inp = build_decode_inputs([5, 70], h_q=2, page_size=64, kv_dtype="fp8_flashmla", seed=2)
    assert inp.kv_cache.shape[-1] == 656 and inp.kv_scales is None
    assert inp.cache.page_bytes == 64 * 656 == 64 * kv_bytes_per_token("fp8_flashmla")
    bf = build_decode_inputs([5, 70], h_q=2, page_size=64, kv_dtype="bf16", seed=2)
    ref_fp8 = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    ref_bf = mla_decode_reference(bf.q, bf.kv_cache, bf.block_table, bf.cache_seqlens)
    assert torch.equal(inp.q, bf.q)
    torch.testing.assert_close(ref_fp8[0], ref_bf[0], atol=0.06, rtol=0.05)  # fp8: ~1/16 per value
    # an unused slot of the pool is poisoned: NaN NoPE bytes and NaN scales
    table, n = inp.block_table[0, 0].item(), 5
    slot = inp.kv_cache[table, n, 0].view(torch.uint8)
    assert (slot[:512] == 0x7F).all() and slot[512:528].contiguous().view(torch.float32).isnan().all()
    cost = mla_decode_cost([5, 70], h_q=2, kv_dtype="fp8_flashmla")
    assert cost.kv_bytes == 75 * 656
    assert mla_decode_cost([5, 70], h_q=2, kv_dtype="fp8").kv_bytes == 75 * 580


@pytest.mark.parametrize("s_q", [1, 2])
def test_triton_reads_the_flashmla_layout(s_q):
    inp = build_decode_inputs([1, 40, 0, 97], h_q=2, s_q=s_q, page_size=32, kv_dtype="fp8_flashmla", seed=5)
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = mla_decode_triton(*args, num_splits="auto", num_sms=3, block_n=16)
    ref_out, ref_lse = mla_decode_reference(*args)
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message
    assert torch.isposinf(lse[2]).all()


def test_reading_one_slot_past_the_end_of_a_flashmla_cache_is_caught():
    inp = build_decode_inputs([40], h_q=2, page_size=64, kv_dtype="fp8_flashmla", seed=6)
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    ref = mla_decode_reference(*args)
    assert check_decode(*mla_decode_triton(*args, num_splits=1, block_n=16), *ref).passed
    over = overreading_decode(mla_decode_triton, 1)(*args, num_splits=1, block_n=16)  # slot 40 is poisoned
    assert not check_decode(*over, *ref).passed


def test_family_accepts_fp8_flashmla_and_counts_656_bytes():
    shape = {"batch": 2, "seqlen": 64, "dist": "fixed", "h_q": 2, "s_q": 1, "page_size": 64}
    FAMILY.validate({**shape, "kv_dtype": "fp8_flashmla"}, {}, "bfloat16", "triton")
    with pytest.raises(ValueError, match="fp8_flashmla"):
        FAMILY.validate({**shape, "kv_dtype": "fp4"}, {}, "bfloat16", "triton")
    cost = FAMILY.cost({**shape, "kv_dtype": "fp8_flashmla"}, "bfloat16")
    assert cost.kv_bytes == 2 * 64 * 656


def test_the_interpreter_rounds_k_to_bf16_as_the_gpu_does_whatever_the_scales():
    # the kernel forms K = fp8 x scale rounded to bf16 (the GPU's cast; the interpreter's own truncates, so
    # it rounds by bits): with scales that are not powers of two the rounding is real, and it must be the
    # one the reference's bf16 dequantisation makes
    inp = build_decode_inputs([23, 40], h_q=2, s_q=2, page_size=16, kv_dtype="fp8_flashmla", seed=8)
    scales = inp.kv_cache.view(torch.uint8)[..., 512:528].view(torch.float32)
    scales.mul_(1.3)  # no longer powers of two: fp8 x scale needs rounding to become bf16
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    res = check_decode(*mla_decode_triton(*args, num_splits=2, block_n=16), *mla_decode_reference(*args))
    assert res.passed, res.message
    assert res.lse.max_abs_err < 2e-6
