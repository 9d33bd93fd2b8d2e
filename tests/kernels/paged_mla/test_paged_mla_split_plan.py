"""The FlashMLA-style split plan: balanced work per unit, contiguous (sequence, block) ranges, and the
Triton kernel driven by it matches the reference on very uneven lengths (interpreter, tiny head dims)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.common.mla.check import check_decode
from kernels.common.mla.reference import mla_decode_reference
from kernels.common.mla.split_plan import balanced_plan, default_num_units, uniform_plan
from kernels.common.mla.triton_decode import mla_decode_triton, plan_for
from kernels.paged_mla.inputs import build_decode_inputs

UNEVEN = [1, 700, 33, 4096]


def covered(plan, lens):
    """Every sequence's token ranges, in chunk order; each must tile [0, seqlen) exactly."""
    seq, lo, hi = plan.chunk_seq.tolist(), plan.chunk_start.tolist(), plan.chunk_end.tolist()
    bounds = plan.seq_chunks.tolist()
    for b, n in enumerate(lens):
        mine = range(bounds[b], bounds[b + 1])
        assert all(seq[c] == b for c in mine)
        pos = 0
        for c in mine:
            assert lo[c] == pos and hi[c] > lo[c]
            pos = hi[c]
        assert pos == n


@pytest.mark.parametrize("units", [1, 3, 7, 64, 132])
@pytest.mark.parametrize("block", [16, 64])
def test_balanced_plan_splits_work_evenly_and_covers_every_token_once(units, block):
    plan = balanced_plan(UNEVEN, num_units=units, block=block)
    covered(plan, UNEVEN)
    work = plan.unit_blocks()
    total = sum(-(-n // block) for n in UNEVEN)
    assert sum(work) == total
    assert max(work) - min(work) <= 1  # balanced within one block
    assert plan.num_units == min(units, total)
    # each unit is one contiguous run of (sequence, block) pairs: its chunks follow one another
    seq, lo, hi = plan.chunk_seq.tolist(), plan.chunk_start.tolist(), plan.chunk_end.tolist()
    bounds = plan.unit_chunks.tolist()
    for u in range(plan.num_units):
        for c in range(bounds[u], bounds[u + 1] - 1):
            nxt = c + 1
            assert (seq[nxt] == seq[c] and lo[nxt] == hi[c]) or (seq[nxt] > seq[c] and lo[nxt] == 0)


def test_long_sequence_is_cut_over_many_units_and_short_ones_share_one():
    plan = balanced_plan(UNEVEN, num_units=16, block=64)
    per_seq = torch.diff(plan.seq_chunks).tolist()
    assert per_seq[3] >= 12  # 64 of the 80 blocks are the 4096-token sequence's
    assert per_seq[0] == per_seq[2] == 1
    # the uniform plan gives every sequence the same count, whatever its length
    assert torch.diff(uniform_plan(UNEVEN, num_splits=4, page_size=64).seq_chunks).tolist() == [4] * 4


def test_empty_sequences_and_an_empty_batch():
    plan = balanced_plan([0, 5, 0], num_units=4, block=16)
    assert torch.diff(plan.seq_chunks).tolist() == [0, 1, 0]
    assert plan.num_units == 1 and plan.unit_blocks() == [1]
    empty = balanced_plan([0, 0], num_units=4, block=16)
    assert empty.num_chunks == 0 and empty.num_units == 1


def test_bad_plan_arguments_are_named():
    with pytest.raises(ValueError, match="num_units"):
        balanced_plan([4], num_units=0, block=16)
    with pytest.raises(ValueError, match=">= 0"):
        balanced_plan([-1], num_units=2, block=16)
    with pytest.raises(ValueError, match="num_splits"):
        plan_for([4], 0, rows=4, block_m=16, block_n=16, page_size=16)
    assert default_num_units(132, 4) == 33 and default_num_units(4, 8) == 1


@pytest.mark.parametrize(("kv_dtype", "s_q", "units"), [("bf16", 1, 5), ("bf16", 2, 9), ("fp8", 1, 7)])
def test_triton_with_balanced_plan_matches_reference_on_uneven_lengths(kv_dtype, s_q, units):
    lens = UNEVEN + [0]
    inp = build_decode_inputs(lens, h_q=2, s_q=s_q, page_size=64, d_qk=48, d_v=32, kv_dtype=kv_dtype, seed=3)
    plan = balanced_plan(lens, num_units=units, block=64)
    assert max(torch.diff(plan.seq_chunks).tolist()) > 1  # the 4096 sequence really is split
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    out, lse = mla_decode_triton(*args, plan=plan, kv_scales=inp.kv_scales, d_v=inp.d_v, block_n=64)
    ref_out, ref_lse = mla_decode_reference(*args, kv_scales=inp.kv_scales, d_v=inp.d_v)
    res = check_decode(out, lse, ref_out, ref_lse)
    assert res.passed, res.message
    assert torch.isposinf(lse[-1]).all() and (out[-1] == 0).all()


def test_auto_is_the_balanced_plan_and_a_plan_for_another_batch_is_refused():
    lens = [3, 200]
    inp = build_decode_inputs(lens, h_q=2, page_size=16, d_qk=48, d_v=32, seed=4)
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    got = mla_decode_triton(*args, d_v=32, num_splits="auto", num_sms=6, block_n=16)
    plan = plan_for(lens, "auto", rows=2, block_m=16, block_n=16, page_size=16, num_sms=6)
    assert plan.kind == "balanced" and plan.num_units == 6
    assert torch.equal(got[0], mla_decode_triton(*args, d_v=32, plan=plan, block_n=16)[0])
    with pytest.raises(ValueError, match="batch of 3"):
        mla_decode_triton(*args, d_v=32, plan=balanced_plan([1, 2, 3], num_units=2, block=16))


def test_a_plan_on_another_device_than_q_is_refused_not_copied_in_the_call():
    """Issue 30: the plan was copied to q's device inside every call (five blocking copies in each timed
    sample). A caller builds it on the device once; one left elsewhere is an error naming the fix, and the
    trial's timed call makes no host-device copy (kernels.measure.clean_call)."""
    from kernels.measure.clean_call import transfers

    lens = [3, 200]
    inp = build_decode_inputs(lens, h_q=2, page_size=16, d_qk=48, d_v=32, seed=4)
    args = (inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    plan = plan_for(lens, "auto", rows=2, block_m=16, block_n=16, page_size=16, num_sms=6)
    with pytest.raises(ValueError, match=r"the split plan is on meta, q on cpu: move it there once"):
        mla_decode_triton(*args, d_v=32, plan=plan.to("meta"), block_n=16)
    assert transfers(lambda: mla_decode_triton(*args, d_v=32, plan=plan, block_n=16)) == []
