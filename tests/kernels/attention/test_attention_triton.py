"""The Triton kernels against the fp32 references, in the interpreter on tiny shapes.

Judged by the FlashMLA rule (kernels.common.mla.check.check_decode): out abs 8e-4 or rel 2.01/128 per
element with cos diff <= 5e-6, lse abs 1e-6 or rel 8.01/65536, NaN/inf positions exact (so an empty row's
lse must be +inf, kernels.common.lse, in the kernel as in the reference).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.attention.inputs import build_dense, build_sparse
from kernels.attention.reference import attention_reference, sparse_attention_reference
from kernels.attention.triton_decode import choose_splits, decode_attention_triton
from kernels.attention.triton_prefill import flash_attention_triton
from kernels.attention.triton_sparse import sparse_attention_triton
from kernels.common.mla.check import check_decode
from kernels.common.triton_attention import head_dims, v_in_k
from testkit.kernels.broken import off_by_one_causal

BF16 = torch.bfloat16


def _passes(got, want) -> bool:
    report = check_decode(got[0], got[1], want[0], want[1])
    assert report.passed, report.message
    return True


# -- prefill --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,s_q,s_k,h_q,h_kv,d,d_v,dtype",
    [
        (1, 1, 1, 2, 1, 16, 16, BF16),  # s_q = s_k = 1
        (1, 5, 5, 2, 2, 32, 32, BF16),  # s_k smaller than a block
        (2, 37, 37, 4, 2, 32, 32, BF16),  # not a block multiple, 3 query blocks, GQA 2
        (1, 20, 45, 4, 1, 48, 16, torch.float32),  # s_q < s_k (chunked prefill), GQA 4, d = 32 + 16
        (1, 33, 33, 3, 3, 16, 24, torch.float16),  # MHA, d_v not a power of two
    ],
)
def test_prefill_matches_reference(b, s_q, s_k, h_q, h_kv, d, d_v, dtype):
    x = build_dense(b, s_q, s_k, h_q, h_kv, d, d_v, dtype=dtype, seed=s_q)
    got = flash_attention_triton(x.q, x.k, x.v, block_m=16, block_n=16)
    assert _passes(got, attention_reference(x.q, x.k, x.v))


def test_prefill_ragged_lengths_and_empty_rows():
    # s_k_b = 3 < s_q = 8 for the second sequence: its first five queries see nothing
    x = build_dense(2, 8, 19, 2, 1, 16, 16, dtype=BF16, seed=2, seqlens=[19, 3])
    got = flash_attention_triton(x.q, x.k, x.v, seqlens_k=x.seqlens_k, block_m=16, block_n=16)
    want = attention_reference(x.q, x.k, x.v, seqlens_k=x.seqlens_k)
    assert torch.isposinf(want[1][1, :, :5]).all() and torch.isposinf(got[1][1, :, :5]).all()
    assert (got[0][1, :5] == 0).all()
    assert _passes(got, want)


def test_off_by_one_causal_mask_is_caught():
    x = build_dense(1, 24, 24, 2, 1, 16, 16, dtype=BF16, seed=7)
    want = attention_reference(x.q, x.k, x.v)
    broken = off_by_one_causal(flash_attention_triton)(x.q, x.k, x.v, block_m=16, block_n=16)
    report = check_decode(broken[0], broken[1], want[0], want[1])
    assert not report.passed
    assert not report.out.passed and not report.lse.passed
    assert report.out.mismatches > 0 and report.out.cos_diff > 5e-6
    # the last query row already sees every key: the shift changes nothing there
    assert report.out.worst_index is not None and report.out.worst_index[1] < 23


# -- decode ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,s_q,s_k,h_q,h_kv,splits,lens",
    [
        (2, 1, 50, 8, 2, None, None),  # GQA 4, default splits
        (3, 1, 70, 4, 4, 3, [70, 1, 33]),  # MHA, 3 splits, a one-token sequence, NaN past the lengths
        (1, 3, 40, 6, 2, 2, None),  # multi-token prediction: causal inside the 3 query tokens
        (2, 2, 17, 4, 1, 4, [17, 1]),  # more splits than blocks; the 1-key sequence has an empty row
    ],
)
def test_decode_matches_reference(b, s_q, s_k, h_q, h_kv, splits, lens):
    x = build_dense(b, s_q, s_k, h_q, h_kv, 32, 32, dtype=BF16, seed=s_k, seqlens=lens)
    got = decode_attention_triton(x.q, x.k, x.v, seqlens_k=x.seqlens_k, num_splits=splits, block_n=16)
    assert _passes(got, attention_reference(x.q, x.k, x.v, seqlens_k=x.seqlens_k))


def test_mla_latent_decode_with_v_inside_k():
    x = build_dense(2, 1, 40, 16, 1, 576, 512, dtype=BF16, seed=9, shared_kv=True, seqlens=[40, 23])
    assert v_in_k(x.k, x.v, head_dims(576, 512))  # the kernel reuses the K tile as V
    got = decode_attention_triton(x.q, x.k, x.v, seqlens_k=x.seqlens_k, num_splits=2, block_n=16)
    assert _passes(got, attention_reference(x.q, x.k, x.v, seqlens_k=x.seqlens_k))


def test_choose_splits_fills_the_gpu_but_keeps_work_per_split():
    assert choose_splits(1, 1, 1, 8192, 64) == 32  # 8192 keys / 256 per split
    assert choose_splits(256, 8, 1, 4096, 64) == 1  # enough programs already
    assert choose_splits(1, 1, 1, 100, 64) == 1


# -- sparse ---------------------------------------------------------------------------------------------


def test_sparse_matches_reference_with_duplicates_padding_and_out_of_range():
    x = build_dense(2, 3, 30, 4, 2, 32, 32, dtype=BF16, seed=11)
    idx = torch.randint(0, 30, (2, 3, 24), generator=torch.Generator().manual_seed(0))
    idx[0, 0, :8] = 5  # many duplicates
    idx[0, 1, 10:] = -1  # padding
    idx[1, 2, ::3] = 30  # out of range counts as padding
    idx[1, 0, :] = -1  # nothing selected
    got = sparse_attention_triton(x.q, x.k, x.v, idx, block_n=16)
    want = sparse_attention_reference(x.q, x.k, x.v, idx)
    assert torch.isposinf(got[1][1, :, 0]).all() and (got[0][1, 0] == 0).all()
    assert _passes(got, want)


def test_sparse_counts_a_repeated_index_once_per_slot():
    x = build_dense(1, 1, 20, 2, 1, 16, 16, dtype=BF16, seed=12)
    assert not v_in_k(x.k, x.v, head_dims(16, 16))
    idx = torch.tensor([[[3, 3, 3, 7, 11, 3]]])  # key 3 four times
    want = sparse_attention_reference(x.q, x.k, x.v, idx)
    got = sparse_attention_triton(x.q, x.k, x.v, idx, block_n=16)
    assert _passes(got, want)
    # the same keys once each is another answer: the kernel must not de-duplicate
    once = sparse_attention_reference(x.q, x.k, x.v, torch.tensor([[[3, 7, 11]]]))
    assert not check_decode(got[0], got[1], once[0], once[1]).passed


def test_sparse_mla_form_with_generated_indices_and_poisoned_rows():
    x = build_sparse(build_dense(1, 2, 48, 16, 1, 576, 512, dtype=BF16, seed=13, shared_kv=True), 20, seed=13)
    assert x.k.isnan().any()  # rows no index names are NaN: reading them would show
    got = sparse_attention_triton(x.q, x.k, x.v, x.indices, block_n=16)
    assert _passes(got, sparse_attention_reference(x.q, x.k, x.v, x.indices))
