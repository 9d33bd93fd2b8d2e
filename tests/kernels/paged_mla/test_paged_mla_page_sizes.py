"""Any page size from 1 to layout.MAX_PAGE_SIZE: the family's spec accepts it and the Triton kernel decodes
it (interpreter), with tiles that are powers of two whether or not they divide the page (issue 43: page 61
crashed inside the kernel, and the spec took 16 / 32 / 64 / 128 only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.base import TrialRequest
from kernels.common.mla.check import check_decode
from kernels.common.mla.decode_kernels import TILE_TARGETS, default_tiles
from kernels.common.mla.layout import MAX_PAGE_SIZE, PAGE_SIZES
from kernels.common.mla.reference import mla_decode_reference
from kernels.common.mla.triton_decode import mla_decode_triton
from kernels.measure.policy import MeasurePolicy
from kernels.paged_mla.case import FAMILY
from kernels.paged_mla.inputs import build_decode_inputs

ODD_PAGES = (1, 3, 61, 100)
POLICY = MeasurePolicy(warmup_ms=0, min_samples=1, max_samples=2, max_time_s=0.2, min_time_s=0)
SHAPE = {"batch": 2, "seqlen": 20, "dist": "fixed", "h_q": 2, "s_q": 1, "page_size": 61, "kv_dtype": "bf16"}


def lens_for(page: int) -> list[int]:
    """Page boundaries (as many as the page allows), a sequence over three pages, and an empty one."""
    return sorted({1, max(1, page - 1), page, page + 1}) + [2 * page + 3, 0]


@pytest.mark.parametrize("kv_format", ["plain", "fp8", "fp8_flashmla"])
@pytest.mark.parametrize("target", TILE_TARGETS)
def test_default_tiles_are_powers_of_two_at_every_page_size(kv_format, target):
    for page in range(1, MAX_PAGE_SIZE + 1):
        for rows in (2, 16, 32, 128):
            for tile in default_tiles(rows, page, kv_format, target):
                assert tile >= 16 and tile & (tile - 1) == 0, (page, rows, tile)


def test_shipped_pages_keep_their_tiles_and_others_round_the_page_up():
    assert [default_tiles(16, p, "plain", "sm_90a")[1] for p in PAGE_SIZES] == [16, 32, 64, 64]
    assert [default_tiles(16, p, "plain", "sm_90a")[1] for p in ODD_PAGES] == [16, 16, 64, 64]


@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("page", ODD_PAGES)
def test_triton_decodes_any_page_size(page, kv_dtype, s_q):
    inp = build_decode_inputs(
        lens_for(page), h_q=2, s_q=s_q, page_size=page, d_qk=96, d_v=64, kv_dtype=kv_dtype
    )
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = mla_decode_triton(*args, kv_scales=inp.kv_scales, d_v=64, num_sms=4)
    res = check_decode(out, lse, *mla_decode_reference(*args, kv_scales=inp.kv_scales, d_v=64))
    assert res.passed, res.message
    assert torch.isposinf(lse[-1]).all() and (out[-1] == 0).all()


@pytest.mark.parametrize("page", [3, 61])
def test_triton_decodes_flashmlas_fp8_cache_at_any_page_size(page):
    inp = build_decode_inputs(
        [page + 1, 7, 0], h_q=2, s_q=2, page_size=page, kv_dtype="fp8_flashmla", seed=page
    )
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = mla_decode_triton(*args, num_splits=2)
    res = check_decode(out, lse, *mla_decode_reference(*args))
    assert res.passed, res.message


def test_a_tile_wider_than_the_page_and_a_page_the_tile_does_not_divide():
    # block_n 64 over pages of 3 tokens (22 pages a tile) and of 100 (tiles straddle page ends)
    for page in (3, 100):
        inp = build_decode_inputs([250, 64], h_q=2, page_size=page, d_qk=96, d_v=64, seed=page)
        args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
        out, lse = mla_decode_triton(*args, d_v=64, num_splits=1, block_n=64)
        res = check_decode(out, lse, *mla_decode_reference(*args, d_v=64))
        assert res.passed, res.message


def test_tiles_that_are_not_powers_of_two_are_refused():
    inp = build_decode_inputs([5], h_q=2, page_size=24, d_qk=96, d_v=64)
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    with pytest.raises(ValueError, match="powers of two"):
        mla_decode_triton(*args, d_v=64, block_n=24)


@pytest.mark.parametrize("page", [*ODD_PAGES, MAX_PAGE_SIZE])
def test_family_accepts_any_page_size_up_to_the_maximum(page):
    FAMILY.validate({**SHAPE, "page_size": page}, {}, "bfloat16", "triton")


@pytest.mark.parametrize("page", [0, MAX_PAGE_SIZE + 1, True, 16.0, "64"])
def test_family_refuses_other_page_sizes(page):
    with pytest.raises(ValueError, match=r"shape\.page_size"):
        FAMILY.validate({**SHAPE, "page_size": page}, {}, "bfloat16", "triton")


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_flashmla"])
def test_a_trial_at_page_61_runs_and_checks(kv_dtype):
    shape = {**SHAPE, "kv_dtype": kv_dtype, "dist": "boundary", "seqlen": 70}
    FAMILY.validate(shape, {}, "bfloat16", "triton")
    o = FAMILY.run(TrialRequest("paged_mla", "triton", shape, {}, "bfloat16", policy=POLICY))
    assert o.status == "ok", o.correctness.get("message") or o.error
    assert o.correctness["passed"] and o.correctness["poisoned"]
