"""The torch references: causal rule, GQA, empty rows (out 0, lse +inf), sparse per-slot semantics (a
repeated index counts once per slot, as FlashMLA's), MLA vs the paged form."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.attention.inputs import build_dense, build_sparse, sparse_indices
from kernels.attention.reference import (
    attention_reference,
    causal_mask,
    mla_decode_reference,
    sparse_attention_reference,
    sparse_counts,
)


def _naive(q, k, v, visible):
    """Per (batch, head, query) loop, K/V heads expanded: the slow obvious answer. `visible [b, s_q, s_k]`
    bool, or counts: a key counted c times is gathered c times."""
    b, s_q, h_q, _ = q.shape
    group = h_q // k.shape[2]
    out = torch.zeros(b, s_q, h_q, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        for h in range(h_q):
            for t in range(s_q):
                keys = torch.arange(k.shape[1]).repeat_interleave(visible[i, t].long())
                if len(keys) == 0:
                    continue
                kk = k[i, keys, h // group].double()
                s = kk @ q[i, t, h].double() / math.sqrt(q.shape[-1])
                lse[i, h, t] = torch.logsumexp(s, 0)
                out[i, t, h] = torch.softmax(s, 0) @ v[i, keys, h // group].double()
    return out, lse


def test_causal_mask_is_bottom_right_aligned():
    m = causal_mask(3, 5, None, 1, "cpu")[0]
    assert m.sum(dim=1).tolist() == [3, 4, 5]  # query i sees s_k - s_q + i + 1 keys
    assert causal_mask(1, 7, None, 1, "cpu")[0].all()  # a single decode query sees everything
    square = causal_mask(4, 4, None, 1, "cpu")[0]
    assert torch.equal(square, torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (4, 2), (6, 1)])
def test_dense_reference_matches_a_naive_loop_with_gqa_and_lengths(h_q, h_kv):
    x = build_dense(2, 3, 9, h_q, h_kv, 16, 8, dtype=torch.float32, seed=1, seqlens=[9, 5])
    out, lse = attention_reference(x.q, x.k, x.v, seqlens_k=x.seqlens_k)
    want_out, want_lse = _naive(x.q, x.k, x.v, causal_mask(3, 9, x.seqlens_k, 2, "cpu"))
    assert not out.isnan().any(), "NaN poison past a sequence's length leaked into the output"
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seqlens", [[2], [0]])
def test_rows_that_see_no_key_are_zero_with_plus_inf_lse(seqlens):
    x = build_dense(1, 4, 6, 2, 1, 16, 16, dtype=torch.float32, seqlens=seqlens)
    out, lse = attention_reference(x.q, x.k, x.v, seqlens_k=x.seqlens_k)
    # s_k_b = 2, s_q = 4: queries 0 and 1 would see keys <= -2 and <= -1: nothing; s_k_b = 0: no query
    empty = 4 - seqlens[0]
    assert torch.isposinf(lse[0, :, :empty]).all() and (out[0, :empty] == 0).all()
    assert torch.isfinite(lse[0, :, empty:]).all() and not out.isnan().any()


def test_sparse_repeats_count_per_slot_and_padding_selects_nothing():
    x = build_dense(1, 2, 10, 2, 1, 16, 16, dtype=torch.float32, seed=3)
    distinct = torch.tensor([[[1, 4, 7, -1], [0, 2, -1, -1]]])
    beyond = torch.tensor([[[1, 4, 7, 10, 99], [0, 2, -5, 10, 10]]])  # out of range = padding
    repeated = torch.tensor([[[7, 1, 4, 4, 1, -1, 7], [2, 2, 0, -1, 2, 0, -1]]])  # same sets, repeated
    a = sparse_attention_reference(x.q, x.k, x.v, distinct)
    c = sparse_attention_reference(x.q, x.k, x.v, beyond)
    torch.testing.assert_close(c[0], a[0], atol=0, rtol=0)
    torch.testing.assert_close(c[1], a[1], atol=0, rtol=0)
    b = sparse_attention_reference(x.q, x.k, x.v, repeated)
    assert torch.equal(sparse_counts(repeated, 10)[0, 1, :3], torch.tensor([2, 0, 3], dtype=torch.int32))
    for idx, got in ((distinct, a), (repeated, b)):
        want = _naive(x.q, x.k, x.v, sparse_counts(idx, 10))  # one gathered key per valid slot
        torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(got[1], want[1], atol=1e-12, rtol=1e-12)
    # row 0 names each of its positions twice: a uniform multiplicity leaves out alone, lse + log 2
    torch.testing.assert_close(b[0][0, 0], a[0][0, 0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(b[1][0, :, 0], a[1][0, :, 0] + math.log(2), atol=1e-12, rtol=1e-12)
    assert (b[0][0, 1] - a[0][0, 1]).abs().max() > 0.05  # row 1: 2 x key 0, 3 x key 2 shifts the mix


def test_sparse_with_every_visible_index_equals_causal_dense():
    s = 7
    x = build_dense(1, s, s, 2, 2, 16, 16, dtype=torch.float32, seed=4)
    idx = torch.tensor([[[j if j <= i else -1 for j in range(s)] for i in range(s)]])
    sparse = sparse_attention_reference(x.q, x.k, x.v, idx)
    dense = attention_reference(x.q, x.k, x.v)
    torch.testing.assert_close(sparse[0], dense[0])
    torch.testing.assert_close(sparse[1], dense[1])


def test_all_padding_row_is_empty():
    x = build_dense(1, 1, 5, 2, 1, 16, 16, dtype=torch.float32)
    out, lse = sparse_attention_reference(x.q, x.k, x.v, torch.full((1, 1, 3), -1))
    assert (out == 0).all() and torch.isposinf(lse).all()


def test_sparse_counts_count_valid_slots_per_position():
    idx = torch.tensor([[[5, 3, 5, -1, 3, 3, 0, 6]]])
    assert sparse_counts(idx, 6)[0, 0].tolist() == [1, 0, 0, 3, 0, 2]  # 6 and -1: padding
    lens = torch.tensor([4])
    assert sparse_counts(idx, 6, lens)[0, 0].tolist() == [1, 0, 0, 3, 0, 0]  # 5 >= s_k_b: padding


def test_generated_sparse_inputs_are_causal_distinct_and_poison_unused_rows():
    idx = sparse_indices(2, 3, 12, 5, seed=2)
    for b in range(2):
        for i in range(3):
            row = [v for v in idx[b, i].tolist() if v >= 0]
            assert len(row) == len(set(row)) == 5
            assert max(row) <= 12 - 3 + i
    small = sparse_indices(1, 2, 3, 8)
    assert (small[0, 0] >= 0).sum() == 2 and (small[0, 1] >= 0).sum() == 3  # fewer visible than topk
    x = build_sparse(build_dense(1, 2, 20, 2, 1, 16, 16, dtype=torch.float32, seed=5), 4, seed=5)
    named = set(x.indices.flatten().tolist()) - {-1}
    for j in range(20):
        assert bool(x.k[0, j].isnan().all()) == (j not in named)
    out, _ = sparse_attention_reference(x.q, x.k, x.v, x.indices)
    assert not out.isnan().any()


def test_mla_latent_reference_matches_the_paged_reference():
    from kernels.common.mla.reference import gather_kv
    from kernels.common.mla.reference import mla_decode_reference as paged_reference
    from kernels.paged_mla.inputs import build_decode_inputs

    lens = [5, 70, 64]
    p = build_decode_inputs(lens, h_q=4, s_q=2, page_size=16, q_dtype=torch.float32, seed=1)
    kv = torch.full((3, max(lens), 1, 576), float("nan"))
    for i, n in enumerate(lens):
        kv[i, :n, 0] = gather_kv(p.kv_cache, p.block_table, n, i)
    seqlens = torch.tensor(lens)
    out, lse = mla_decode_reference(p.q, kv, seqlens_k=seqlens)
    want_out, want_lse = paged_reference(p.q, p.kv_cache, p.block_table, p.cache_seqlens)
    assert out.dtype == lse.dtype == torch.float64  # the correctness reference is fp64
    torch.testing.assert_close(out.float(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.float(), want_lse, atol=1e-5, rtol=1e-5)
