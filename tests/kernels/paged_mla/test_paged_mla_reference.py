import math

import pytest
import torch

from kernels.common.mla.cache import PagedKVCache
from kernels.common.mla.layout import dequantize_fp8, quantize_fp8_per_token
from kernels.common.mla.reference import mla_decode_reference
from kernels.paged_mla.inputs import build_decode_inputs, pages_needed, sample_seqlens

D_QK, D_V = 24, 16


def naive_attention(q, dense_kv, seqlens, d_v, scale):
    """Plain loops in float64 over a dense (unpaged) KV per sequence."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float64)  # FlashMLA's empty-row lse
    for i in range(b):
        kv = dense_kv[i].double()
        for s in range(s_q):
            last = seqlens[i] - s_q + s  # last visible key
            if last < 0:
                continue
            keys = kv[: last + 1]
            for h in range(h_q):
                logits = [float(q[i, s, h].double() @ keys[j]) * scale for j in range(last + 1)]
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                total = sum(w)
                lse[i, h, s] = m + math.log(total)
                out[i, s, h] = sum(wj * keys[j, :d_v] for j, wj in enumerate(w)) / total
    return out, lse


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("page", [4, 16])
@pytest.mark.parametrize("s_q", [1, 2, 3])
def test_reference_matches_naive_dense(kv_dtype, page, s_q):
    g = torch.Generator().manual_seed(page * 10 + s_q)
    seqlens = [1, page - 1, page, page + 1, 2, 0]
    h_q = 2
    cache = PagedKVCache(
        sum(-(-n // page) for n in seqlens) + 2,
        page,
        head_dim=D_QK,
        kv_dtype=kv_dtype,
        page_order=torch.randperm(sum(-(-n // page) for n in seqlens) + 2, generator=g).tolist(),
    )
    dense = []
    for i, n in enumerate(seqlens):
        kv = torch.randn(n, D_QK, generator=g)
        cache.add_sequence(i, range(i * 1000, i * 1000 + n), kv)
        dense.append(
            dequantize_fp8(*quantize_fp8_per_token(kv)) if kv_dtype == "fp8" else kv.bfloat16().float()
        )
    t = cache.kernel_inputs(pad_blocks=2)
    q = torch.randn(len(seqlens), s_q, h_q, D_QK, generator=g).bfloat16()
    scale = 1 / math.sqrt(D_QK)
    out, lse = mla_decode_reference(
        q, t.kv_cache, t.block_table, t.cache_seqlens, kv_scales=t.kv_scales, d_v=D_V
    )
    want_out, want_lse = naive_attention(q, dense, seqlens, D_V, scale)
    assert out.dtype == lse.dtype == torch.float32
    assert out.shape == (len(seqlens), s_q, h_q, D_V) and lse.shape == (len(seqlens), h_q, s_q)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)  # +inf positions equal
    # Empty rows (seqlen 0; queries hidden by the causal rule): out 0, lse +inf (as FlashMLA returns)
    assert (out[-1] == 0).all() and torch.isposinf(lse[-1]).all()
    if s_q > 1:
        assert torch.isposinf(lse[0, :, : s_q - 1]).all() and (out[0, : s_q - 1] == 0).all()
    assert torch.isfinite(out).all()  # NaN-poisoned slots were never read


def test_reference_real_dims_default_scale():
    inp = build_decode_inputs([1, 63, 64, 65], h_q=2, s_q=2, page_size=64, seed=3, shared_prefix=64)
    assert inp.cache.stats().hits == 1  # the 65-token sequence reuses the 64-token one's page
    out, lse = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    assert out.shape == (4, 2, 2, 512) and torch.isfinite(out).all()
    assert torch.isposinf(lse[0, :, 0]).all() and torch.isfinite(lse[1:]).all()
    # softmax_scale default is 1/sqrt(576): passing it explicitly changes nothing.
    out2, _ = mla_decode_reference(
        inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, softmax_scale=1 / 24
    )
    torch.testing.assert_close(out, out2)


def test_seqlen_distributions():
    assert sample_seqlens("fixed", 3, 100, 16) == [100, 100, 100]
    assert sample_seqlens("boundary", 6, 1000, 16) == [1, 15, 16, 17, 1000, 1]
    u = sample_seqlens("uniform", 50, 300, 16, seed=1)
    assert min(u) >= 1 and max(u) <= 300 and u == sample_seqlens("uniform", 50, 300, 16, seed=1)
    s = sample_seqlens("skewed", 200, 16384, 64, seed=2)
    assert s[0] == 16384 and sorted(s)[100] < 16384 // 8  # the median is short, the tail long
    with pytest.raises(ValueError, match="distribution"):
        sample_seqlens("zipf", 2, 10, 16)


def test_builder_poisons_unused_slots_and_table_entries():
    inp = build_decode_inputs([5, 16, 17], h_q=2, page_size=16, d_qk=D_QK, d_v=D_V, kv_dtype="fp8", seed=0)
    bt, kv, sc = inp.block_table, inp.kv_cache, inp.kv_scales
    assert sc is not None
    assert (bt[:, -1] == 2**31 - 1).all() and bt[0, 1] == 2**31 - 1 and bt[1, 1] == 2**31 - 1
    assert torch.isnan(kv[bt[0, 0], 5:].float()).all() and torch.isnan(sc[bt[0, 0], 5:]).all()
    assert torch.isnan(sc[bt[2, 1], 1:]).all() and torch.isfinite(sc[bt[2, 1], :1]).all()


def test_pool_is_sized_for_shared_prefix_pages():
    assert pages_needed([20, 20], 16) == 4
    assert pages_needed([20, 20, 5], 16, shared_prefix=16) == 4  # one prefix page stored once
    assert pages_needed([40, 40], 16, shared_prefix=40) == 4  # two shared full pages, private tails
    inp = build_decode_inputs([40, 40, 10], h_q=1, page_size=16, d_qk=D_QK, d_v=D_V, shared_prefix=40)
    s = inp.cache.stats()
    assert inp.kv_cache.shape[0] == pages_needed([40, 40, 10], 16, 40) == s.pages_in_use == 5
    assert (s.hits, s.pages_free) == (2, 0)
