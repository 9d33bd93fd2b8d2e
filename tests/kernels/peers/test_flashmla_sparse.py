"""The attention family against FlashMLA's reference semantics, on FlashMLA's own terms.

The peers below are written here, independently of kernels.attention, from what FlashMLA's tests define
(tests/ref.py: the sparse prefill and sparse decode references; the dense decoding test's reference):
  - sparse: each query token gathers K/V once per index SLOT: a position named twice in its top-k list
    enters the softmax twice (its weight is doubled), there is no de-duplication. A slot whose index is
    < 0 or >= the sequence's key count is invalid: score -inf, nothing read. (FlashMLA's topk_length,
    which invalidates the slots past a per-row count, has no counterpart in the project: the padding
    is -1 or an out-of-range index.) The decode form zeroes NaN in the gathered rows.
  - dense: causal mask tril(diagonal = s_k - s_q) (bottom-right aligned), applied when s_q > 1; NaN in
    the keys zeroed.
  - a query row with no valid key ("lonely"): out 0 and lse +inf; lse is the natural log.
Compared, on small cases: the project's fp64 references and its Triton kernels (in the interpreter:
tests/conftest.py sets TRITON_INTERPRET) for prefill, split-KV decode and the top-k sparse gather, with
odd lengths, several sequences, zero-length sequences, s_q > 1, repeated indices and padding; and the
farm's sparse trial, which must time the kernel on the peer's semantics.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.attention.inputs import build_dense
from kernels.attention.reference import attention_reference, sparse_attention_reference

BF16, F32 = torch.bfloat16, torch.float32


@dataclass(frozen=True)
class Tol:
    out: tuple[float, float]  # (atol, rtol)
    lse: tuple[float, float]


# Per input dtype, a backend against the fp64 peer. The peers compute in fp64 from the inputs' values.
TOL = {
    # fp64 references: the same sums in another order
    torch.float64: Tol(out=(1e-12, 1e-12), lse=(1e-12, 1e-12)),
    # fp32 inputs, fp32 kernel arithmetic (IEEE dots): a few fp32 ulps of the sums
    F32: Tol(out=(2e-5, 2e-5), lse=(2e-5, 2e-5)),
    # bf16 inputs: the kernel's fp32 out is rounded to bf16 (half an ulp, 2^-9 relative), lse stays fp32
    BF16: Tol(out=(4e-3, 8e-3), lse=(2e-5, 2e-5)),
}


def _assert_matches(got, want, tol: Tol) -> None:
    """out and lse against the peer's; inf positions must agree in sign (assert_close compares them)."""
    torch.testing.assert_close(got[0].double(), want[0], atol=tol.out[0], rtol=tol.out[1])
    torch.testing.assert_close(got[1].double(), want[1], atol=tol.lse[0], rtol=tol.lse[1])


# -- the peers -------------------------------------------------------------------------------------------


def _lonely_to_flashmla(scores: torch.Tensor, vals: torch.Tensor, eq: str):
    """softmax over the last dim of `scores` applied to `vals` with FlashMLA's lonely-row rule."""
    lse = torch.logsumexp(scores, dim=-1)
    lse_for_o = torch.where(torch.isneginf(lse), math.inf, lse)  # exp(-inf - inf) = 0: out 0
    out = torch.einsum(eq, torch.exp(scores - lse_for_o[..., None]), vals)
    return out, torch.where(torch.isneginf(lse), math.inf, lse)


def _empty_outputs(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, v.shape[-1], dtype=torch.float64)
    return out, torch.zeros(b, h_q, s_q, dtype=torch.float64)


def _lengths(k: torch.Tensor, seqlens) -> list[int]:
    return [k.shape[1] if seqlens is None else int(seqlens[i]) for i in range(k.shape[0])]


def peer_sparse(q, k, v, indices, scale, seqlens=None, zero_nan=False):
    """FlashMLA's sparse reference on the project's layouts (GQA: head h reads KV head h // group):
    q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v], indices [b, s_q, topk] ->
    out [b, s_q, h_q, d_v], lse [b, h_q, s_q] (fp64)."""
    group = q.shape[2] // k.shape[2]
    out, lse = _empty_outputs(q, v)
    for i, n in enumerate(_lengths(k, seqlens)):
        idx = indices[i].long()  # [s_q, topk]
        invalid = (idx < 0) | (idx >= n)
        slot = idx.masked_fill(invalid, 0)
        kg = k[i].double()[slot].repeat_interleave(group, dim=2)  # [s_q, topk, h_q, d], one row a slot
        vg = v[i].double()[slot].repeat_interleave(group, dim=2)
        gone = invalid[:, :, None, None]
        kg, vg = kg.masked_fill(gone, 0.0), vg.masked_fill(gone, 0.0)  # an invalid slot reads nothing
        if zero_nan:
            kg, vg = kg.nan_to_num(0.0), vg.nan_to_num(0.0)
        scores = torch.einsum("shd,sthd->sht", q[i].double(), kg) * scale
        scores = scores.masked_fill(invalid[:, None, :], -math.inf)
        o, row_lse = _lonely_to_flashmla(scores, vg, "sht,sthv->shv")
        out[i], lse[i] = o, row_lse.transpose(0, 1)
    return out, lse


def peer_dense(q, k, v, scale, seqlens=None, causal=True):
    """FlashMLA's dense reference, per sequence over its first seqlens[i] keys (fp64)."""
    s_q, group = q.shape[1], q.shape[2] // k.shape[2]
    out, lse = _empty_outputs(q, v)
    for i, n in enumerate(_lengths(k, seqlens)):
        kk = k[i, :n].double().nan_to_num(0.0).repeat_interleave(group, dim=1)  # [n, h_q, d]
        vv = v[i, :n].double().nan_to_num(0.0).repeat_interleave(group, dim=1)
        scores = torch.einsum("shd,nhd->hsn", q[i].double(), kk) * scale
        if causal and s_q > 1:
            visible = torch.ones(s_q, n, dtype=torch.bool).tril(diagonal=n - s_q)
            scores = scores.masked_fill(~visible, -math.inf)
        o, lse[i] = _lonely_to_flashmla(scores, vv, "hsn,nhv->shv")
        out[i] = o
    return out, lse


def test_the_peers_follow_flashmlas_rules_on_a_hand_case():
    q = torch.tensor([[[[1.0, 0.0]]]])  # b 1, s_q 1, h 1, d 2
    k = torch.tensor([[[[0.0, 0.0]], [[1.0, 0.0]]]])  # scores 0 and 1 (scale 1)
    v = torch.tensor([[[[1.0]], [[2.0]]]])
    once = peer_sparse(q, k, v, torch.tensor([[[0, 1]]]), 1.0)
    twice = peer_sparse(q, k, v, torch.tensor([[[0, 1, 1, -1, 2]]]), 1.0)  # slot 1 twice, 2 invalid
    e = math.e
    assert once[1].item() == pytest.approx(math.log(1 + e))
    assert twice[1].item() == pytest.approx(math.log(1 + 2 * e))
    assert twice[0].item() == pytest.approx((1 + 2 * 2 * e) / (1 + 2 * e))
    lonely = peer_sparse(q, k, v, torch.tensor([[[-1, 7]]]), 1.0)
    assert lonely[0].item() == 0.0 and lonely[1].item() == math.inf
    dense = peer_dense(q.expand(1, 3, 1, 2), k, v, 1.0)  # s_q 3 > s_k 2: query 0 sees no key
    assert dense[1][0, 0].tolist()[0] == math.inf and torch.isfinite(dense[1][0, 0, 1:]).all()


# -- cases ----------------------------------------------------------------------------------------------


def sparse_case(b, s_q, s_k, topk, seed):
    """Random indices (repeats where topk is large against s_k) over the token rows r = b x s_q: row 0
    names one position in every other slot, the last row has -1 and out-of-range padding, row 1 (when
    it is not the last) is all padding (lonely), row 2 names each of its positions twice."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, s_k, (b * s_q, topk), generator=g)
    rows[0, 1::2] = rows[0, 0]
    rows[-1, ::3] = -1
    rows[-1, 1::3] = s_k + 3  # out of range: padding, never read
    if b * s_q > 2:
        rows[1] = -1
    if b * s_q > 3:
        half = topk // 2
        rows[2, half : 2 * half] = rows[2, :half]
    return rows.reshape(b, s_q, topk).to(torch.int32)


DENSE = [  # (b, s_q, s_k, h_q, h_kv, d, d_v, seqlens, dtype)
    (3, 5, 13, 4, 2, 32, 16, [13, 0, 3], BF16),  # zero-length, s_q > s_k_b (lonely rows), GQA 2
    (2, 1, 9, 2, 1, 48, 32, [9, 0], F32),  # decode, d = 32 + 16
    (1, 7, 7, 3, 3, 16, 24, None, F32),  # square causal, odd, d_v not a power of two
]


@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,d,d_v,seqlens,dtype", DENSE)
def test_dense_reference_agrees_with_flashmlas(b, s_q, s_k, h_q, h_kv, d, d_v, seqlens, dtype):
    x = build_dense(b, s_q, s_k, h_q, h_kv, d, d_v, dtype=dtype, seed=s_k, seqlens=seqlens)
    want = peer_dense(x.q, x.k, x.v, x.softmax_scale, x.seqlens_k)
    got = attention_reference(x.q, x.k, x.v, softmax_scale=x.softmax_scale, seqlens_k=x.seqlens_k)
    _assert_matches(got, want, TOL[torch.float64])


@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,d,d_v,seqlens,dtype", DENSE[:2])
def test_triton_prefill_agrees_with_flashmlas_dense(b, s_q, s_k, h_q, h_kv, d, d_v, seqlens, dtype):
    from kernels.attention.triton_prefill import flash_attention_triton

    x = build_dense(b, s_q, s_k, h_q, h_kv, d, d_v, dtype=dtype, seed=s_k, seqlens=seqlens)
    got = flash_attention_triton(x.q, x.k, x.v, seqlens_k=x.seqlens_k, block_m=16, block_n=16)
    _assert_matches(got, peer_dense(x.q, x.k, x.v, x.softmax_scale, x.seqlens_k), TOL[dtype])


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_triton_split_kv_decode_agrees_with_flashmlas_dense(dtype):
    from kernels.attention.triton_decode import decode_attention_triton

    # s_q 2 (multi-token prediction), 3 splits: sequence 1 is empty, sequence 2's first query sees nothing
    x = build_dense(3, 2, 37, 4, 2, 32, 32, dtype=dtype, seed=5, seqlens=[37, 0, 1])
    got = decode_attention_triton(x.q, x.k, x.v, seqlens_k=x.seqlens_k, num_splits=3, block_n=16)
    _assert_matches(got, peer_dense(x.q, x.k, x.v, x.softmax_scale, x.seqlens_k), TOL[dtype])


SPARSE = [  # (b, s_q, s_k, h_q, h_kv, d, d_v, topk, seqlens)
    (1, 4, 23, 4, 2, 32, 16, 12, None),  # prefill-like, GQA 2
    (3, 1, 29, 2, 1, 48, 32, 9, [29, 0, 11]),  # decode, a zero-length sequence, ragged, d = 32 + 16
    (2, 3, 17, 2, 2, 16, 16, 33, [17, 5]),  # topk > s_k: every position named about twice
]


@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,d,d_v,topk,seqlens", SPARSE)
def test_sparse_reference_counts_each_slot_as_flashmla(b, s_q, s_k, h_q, h_kv, d, d_v, topk, seqlens):
    x = build_dense(b, s_q, s_k, h_q, h_kv, d, d_v, dtype=F32, seed=topk, seqlens=seqlens, poison=False)
    idx = sparse_case(b, s_q, s_k, topk, seed=topk)
    want = peer_sparse(x.q, x.k, x.v, idx, x.softmax_scale, x.seqlens_k)
    got = sparse_attention_reference(x.q, x.k, x.v, idx, softmax_scale=x.softmax_scale, seqlens_k=x.seqlens_k)
    _assert_matches(got, want, TOL[torch.float64])


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,d,d_v,topk,seqlens", SPARSE[:2])
def test_triton_sparse_counts_each_slot_as_flashmla(b, s_q, s_k, h_q, h_kv, d, d_v, topk, seqlens, dtype):
    from kernels.attention.triton_sparse import sparse_attention_triton

    x = build_dense(b, s_q, s_k, h_q, h_kv, d, d_v, dtype=dtype, seed=topk, seqlens=seqlens)
    idx = sparse_case(b, s_q, s_k, topk, seed=topk)
    got = sparse_attention_triton(x.q, x.k, x.v, idx, seqlens_k=x.seqlens_k, block_n=16)
    _assert_matches(got, peer_sparse(x.q, x.k, x.v, idx, x.softmax_scale, x.seqlens_k), TOL[dtype])


def test_triton_sparse_mla_form_agrees_with_flashmlas_decode_reference():
    from kernels.attention.triton_sparse import sparse_attention_triton

    # one KV head, V the first 512 channels of the 576-channel row; NaN past the lengths (zeroed by
    # FlashMLA's decode reference, never read by the kernel)
    x = build_dense(2, 1, 24, 16, 1, 576, 512, dtype=BF16, seed=3, shared_kv=True, seqlens=[24, 7])
    idx = sparse_case(2, 1, 24, 10, seed=3)
    got = sparse_attention_triton(x.q, x.k, x.v, idx, seqlens_k=x.seqlens_k, block_n=16)
    want = peer_sparse(x.q, x.k, x.v, idx, x.softmax_scale, x.seqlens_k, zero_nan=True)
    assert torch.isposinf(want[1][1]).all()  # sequence 1's only token has no valid index
    _assert_matches(got, want, TOL[BF16])


SPARSE_DECODE_TRIAL = {"mode": "sparse_decode", "batch": 2, "s_q": 1, "s_k": 30, "h_q": 4, "h_kv": 2, "d": 32,
                       "topk": 8}  # fmt: skip


def test_the_farms_sparse_trial_times_the_peers_semantics(monkeypatch):
    """The triton backend's timed call and the trial's reference, on indices with repeats."""
    from kernels.attention import case
    from kernels.attention.shapes import parse_shape

    build = case.build_sparse

    def with_repeats(*args, **kwargs):
        x = build(*args, **kwargs)
        x.indices[:, :, 1::2] = x.indices[:, :, :1]  # the first position in every other slot
        return x

    monkeypatch.setattr(case, "build_sparse", with_repeats)
    shape = parse_shape(SPARSE_DECODE_TRIAL)
    prep = case.prepare(shape, "triton", {"block_m": 16, "block_n": 16}, BF16, 0, torch.device("cpu"))
    out, lse = prep.run(None)
    ref_out, ref_lse = prep.reference()
    s = shape  # the trial's inputs again (seed 0, bf16)
    x = with_repeats(
        build_dense(s.batch, s.s_q, s.s_k, s.h_q, s.h_kv, s.d, s.d_v, dtype=BF16, seed=0), s.topk, seed=0
    )
    assert (x.indices[:, :, 0] == x.indices[:, :, 1]).all()
    want = peer_sparse(x.q, x.k, x.v, x.indices, x.softmax_scale)
    _assert_matches((out, lse), want, TOL[BF16])
    _assert_matches((ref_out, ref_lse), want, TOL[torch.float64])
