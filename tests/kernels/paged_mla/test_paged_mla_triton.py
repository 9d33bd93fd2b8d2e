import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.common.mla.check import check_decode
from kernels.common.mla.reference import mla_decode_reference
from kernels.common.mla.triton_decode import choose_num_splits, mla_decode_triton
from kernels.paged_mla.inputs import DecodeInputs, build_decode_inputs
from testkit.kernels.broken import overreading_decode

D_QK, D_V = 96, 64  # small head dims for speed; the real 576/512 run once below


def run_both(inp: DecodeInputs, decode=mla_decode_triton, **kw):
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = decode(*args, kv_scales=inp.kv_scales, d_v=inp.d_v, **kw)
    ref_out, ref_lse = mla_decode_reference(*args, kv_scales=inp.kv_scales, d_v=inp.d_v)
    return out, lse, ref_out, ref_lse


def boundary_lens(page: int) -> list[int]:
    return [1, page - 1, page, page + 1, 2 * page + 3, 0]


# Every page size x s_q x cache type with 3 splits (several of them empty for the short sequences); one
# split, the no-combine path, on page 64 only, to keep the interpreter time down.
CASES = [(kv, page, s_q, 3) for kv in ("bf16", "fp8") for page in (16, 32, 64, 128) for s_q in (1, 2)]
CASES += [(kv, 64, s_q, 1) for kv in ("bf16", "fp8") for s_q in (1, 2)]


@pytest.mark.parametrize(("kv_dtype", "page", "s_q", "num_splits"), CASES)
def test_triton_matches_reference(kv_dtype, page, s_q, num_splits):
    inp = build_decode_inputs(
        boundary_lens(page), h_q=3, s_q=s_q, page_size=page, d_qk=D_QK, d_v=D_V, kv_dtype=kv_dtype, seed=page
    )
    out, lse, ref_out, ref_lse = run_both(inp, num_splits=num_splits)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message
    assert (out[-1] == 0).all() and torch.isposinf(lse[-1]).all()  # seqlen 0: lse +inf, as FlashMLA
    if s_q == 2:  # seqlen 1: the first query token sees nothing
        assert torch.isposinf(lse[0, :, 0]).all() and (out[0, 0] == 0).all()


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_every_row_block_split_and_sequence_gets_its_own_program(kv_dtype):
    # the split kernel's 1-D grid puts the row block fastest, then the split, then the sequence: with 3
    # row blocks (40 rows, block_m 16), 3 splits and 3 sequences a wrong decomposition of the program id
    # leaves rows unwritten or computes them over the wrong keys
    inp = build_decode_inputs(
        [40, 17, 33], h_q=20, s_q=2, page_size=16, d_qk=D_QK, d_v=D_V, kv_dtype=kv_dtype, seed=11
    )
    out, lse, ref_out, ref_lse = run_both(inp, num_splits=3, block_m=16, block_n=16)
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message
    assert torch.isfinite(lse).all()


def test_fp8_default_block_n_is_smaller_than_bf16s():
    from kernels.common.mla.decode_kernels import default_block_n

    assert [default_block_n(p, fp8=True) for p in (16, 32, 64, 128)] == [16, 16, 32, 32]
    assert [default_block_n(p, fp8=False) for p in (16, 32, 64, 128)] == [16, 32, 64, 64]


def test_default_tiles_per_cache_format():
    from kernels.common.mla.decode_kernels import default_block_m, default_block_n

    # a plain cache with >= 64 query rows takes 64-row tiles (wgmma on sm_90a); fewer rows and the fp8
    # caches stay on 16 / 32 rows; FlashMLA's fp8 layout takes 16 x 16 (its 32-row tiles spilled)
    assert [default_block_m(r) for r in (2, 16, 32, 63, 64, 256)] == [16, 16, 32, 32, 64, 64]
    assert [default_block_m(r, "fp8") for r in (16, 32, 64, 256)] == [16, 32, 32, 32]
    assert [default_block_m(r, "fp8_flashmla") for r in (16, 64, 256)] == [16, 16, 16]
    assert [default_block_n(p, True, "fp8_flashmla") for p in (16, 64, 128)] == [16, 16, 16]


def test_triton_default_64_row_tiles_match_reference():
    # h_q 32 x s_q 2 = 64 rows: the default 64-row tile (the sm_90a wgmma path) over several pages,
    # causal rows and an empty sequence
    inp = build_decode_inputs([1, 17, 40, 0], h_q=32, s_q=2, page_size=16, d_qk=D_QK, d_v=D_V, seed=5)
    out, lse, ref_out, ref_lse = run_both(inp, num_splits=2)
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_triton_real_dims(kv_dtype):
    inp = build_decode_inputs(
        [1, 63, 64, 65], h_q=2, s_q=2, page_size=64, kv_dtype=kv_dtype, seed=7, shared_prefix=64
    )
    out, lse, ref_out, ref_lse = run_both(inp, num_splits=2)
    assert out.shape == (4, 2, 2, 512) and lse.shape == (4, 2, 2)
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message


def test_more_splits_than_pages_and_auto_splits():
    inp = build_decode_inputs([3, 40, 17], h_q=2, s_q=1, page_size=16, d_qk=D_QK, d_v=D_V, seed=1)
    for n in (None, 8):  # 8 splits over at most 3 pages: most splits are empty
        res = check_decode(*run_both(inp, num_splits=n))
        assert res.passed, res.message


def test_choose_num_splits():
    # One long sequence, few heads: spread over the SMs, capped by pages and by work per split.
    assert choose_num_splits([16384], rows=16, block_m=16, page_size=64) == 64
    assert choose_num_splits([16384], rows=16, block_m=16, page_size=64, num_sms=20) == 20
    assert choose_num_splits([1000], rows=16, page_size=64) == 3  # 1000 // 256 tokens per split
    assert choose_num_splits([100] * 4, rows=16, page_size=64) == 1
    # A big batch already fills the machine.
    assert choose_num_splits([4096] * 128, rows=128, block_m=32, page_size=64) == 1
    assert choose_num_splits([0, 0], rows=4) == 1


def test_overread_one_slot_is_caught():
    inp = build_decode_inputs([5, 20], h_q=2, page_size=16, d_qk=D_QK, d_v=D_V, seed=3)
    res = check_decode(
        *run_both(inp, overreading_decode(mla_decode_triton, 1), num_splits=1)
    )  # slot seqlen: NaN
    assert not res.passed and res.out.nonfinite_mismatches > 0


def test_overread_caught_in_fp8_through_scales():
    inp = build_decode_inputs([5, 20], h_q=2, page_size=16, d_qk=D_QK, d_v=D_V, kv_dtype="fp8", seed=3)
    res = check_decode(*run_both(inp, overreading_decode(mla_decode_triton, 1), num_splits=2))
    assert not res.passed and res.out.nonfinite_mismatches > 0


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_block_table_pointing_at_poisoned_page_is_caught(kv_dtype):
    inp = build_decode_inputs(
        [20, 20], h_q=2, page_size=16, d_qk=D_QK, d_v=D_V, seed=4, extra_pages=1, kv_dtype=kv_dtype
    )
    used = set(inp.block_table[inp.block_table < inp.kv_cache.shape[0]].tolist())
    spare = next(p for p in range(inp.kv_cache.shape[0]) if p not in used)  # never written: all NaN
    ref_out, ref_lse = mla_decode_reference(
        inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, d_v=inp.d_v, kv_scales=inp.kv_scales
    )
    bad_table = inp.block_table.clone()
    bad_table[1, 0] = spare
    out, lse = mla_decode_triton(
        inp.q, inp.kv_cache, bad_table, inp.cache_seqlens, d_v=inp.d_v, num_splits=1, kv_scales=inp.kv_scales
    )
    res = check_decode(out, lse, ref_out, ref_lse)
    assert not res.passed and res.out.nonfinite_mismatches > 0
    assert torch.isfinite(out[0]).all()  # the other sequence is untouched


def test_bad_arguments():
    inp = build_decode_inputs([5], h_q=2, page_size=16, d_qk=D_QK, d_v=D_V, kv_dtype="fp8", seed=0)
    with pytest.raises(ValueError, match="kv_scales"):
        mla_decode_triton(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens, d_v=D_V)
    with pytest.raises(ValueError, match="num_splits"):
        mla_decode_triton(
            inp.q,
            inp.kv_cache,
            inp.block_table,
            inp.cache_seqlens,
            kv_scales=inp.kv_scales,
            d_v=D_V,
            num_splits=0,
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without a GPU")
def test_interpreter_is_chosen_without_a_gpu_when_unset():
    """A farm worker on a CPU box: TRITON_INTERPRET unset, the module sets it before importing triton."""
    script = (
        "from kernels.paged_mla.inputs import build_decode_inputs\n"
        "from kernels.common.mla.triton_decode import interpreting, mla_decode_triton\n"
        "inp = build_decode_inputs([3], h_q=1, page_size=16, d_qk=32, d_v=16)\n"
        "args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)\n"
        "out, lse = mla_decode_triton(*args, d_v=16, num_splits=1)\n"
        "print(interpreting(), bool(lse.isfinite().all()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "True"]
