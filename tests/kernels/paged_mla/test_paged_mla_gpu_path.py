"""The GPU arithmetic of the Triton decode (kernels.common.mla.triton_decode), imitated step by step in torch
and held to the reference by FlashMLA's rule (kernels.common.mla.check), so that a CPU run shows what a
GPU run would: q in bf16; K as the kernel forms it (bf16 as stored, or FlashMLA's fp8 NoPE x its tile's
scale rounded to bf16); the two dots (NoPE, RoPE) accumulated in fp32; a base-2 online softmax over
BLOCK_N-token steps with P rounded to bf16 before P @ V; the chunks of the default (balanced) split plan
merged by their lse as the combine kernel does; out rounded to bf16. The interpreter runs the kernel
with fp32 dots instead, so it cannot show this.

With FlashMLA's fp8 cache, a scale that is not a power of two (amax / 448, the layout before issue 43)
makes the tensor cores' bf16 K differ from the reference's K: lse off by up to ~5e-3 and out's cosine
diff above 5e-6 from 1 to 70 tokens.

Inputs: the family's own (build_decode_inputs: V entries at FlashMLA's 0.1, scores of unit spread). With
unit V entries FlashMLA's absolute limit (8e-4) is broken at 15-70 tokens by the bf16 rounding of P alone,
FlashMLA's arithmetic too, on a bf16 cache as on an fp8 one: `test_unit_v_entries_would_break_the_rule`
keeps that reason on record.
"""

import math

import pytest
import torch

from kernels.common.mla.check import check_decode
from kernels.common.mla.decode_kernels import default_tiles, kv_format_of
from kernels.common.mla.layout import D_V, FLASHMLA_ROPE_OFFSET, FLASHMLA_SCALE_OFFSET, FLASHMLA_TILE
from kernels.common.mla.reference import gather_kv, mla_decode_reference
from kernels.common.mla.split_plan import SplitPlan, balanced_plan, default_num_units
from kernels.common.mla.triton_decode import DEFAULT_NUM_SMS
from kernels.paged_mla.inputs import DecodeInputs, build_decode_inputs

LOG2E = 1.4426950408889634


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of tiny torch ops: on a shared 2-core runner, intra-op threads make them ~50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Rounded to nearest bf16, kept in fp32 (the kernel's .to(tl.bfloat16) on a GPU)."""
    return x.to(torch.bfloat16).float()


def kernel_k(inp: DecodeInputs, b: int, n: int) -> torch.Tensor:
    """Sequence b's first n tokens [n, 576] as the kernel's tensor-core operands: fp32 holding bf16."""
    page = inp.kv_cache.shape[1]
    pos = torch.arange(n)
    blk = inp.block_table[b, pos // page].long()
    rows = inp.kv_cache[blk, pos % page, 0]
    if kv_format_of(inp.kv_cache) == "plain":
        return rows.float()
    raw = rows.view(torch.uint8)
    fp8 = raw[:, :FLASHMLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[:, FLASHMLA_SCALE_OFFSET:FLASHMLA_ROPE_OFFSET].contiguous().view(torch.float32)
    nope = fp8.reshape(n, -1, FLASHMLA_TILE) * scale[:, :, None]  # fp32 product, as the kernel
    rope = raw[:, FLASHMLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([bf16(nope.reshape(n, D_V)), rope], dim=1)


def split_partial(q, k, limit, start, end, block_n, scale_log2):
    """One program of _split_kernel on GPU: rows q [rows, 576] over tokens [start, end) of k, row r seeing
    the tokens < limit[r]. Returns the normalised partial out [rows, 512] and its natural-log lse."""
    rows = q.shape[0]
    m = torch.full((rows,), -math.inf)
    l_sum = torch.zeros(rows)
    acc = torch.zeros(rows, D_V)
    for n0 in range(start, end, block_n):
        pos = torch.arange(n0, min(n0 + block_n, end))
        kt = k[pos]
        s = q[:, :D_V] @ kt[:, :D_V].T + q[:, D_V:] @ kt[:, D_V:].T  # two fp32-accumulated dots
        s = (s * scale_log2).masked_fill(pos[None, :] >= limit[:, None], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=1))
        m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        alpha = torch.exp2(m - m_safe)
        p = torch.exp2(s - m_safe[:, None])
        l_sum = l_sum * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + bf16(p) @ kt[:, :D_V]  # P rounded to bf16 before P @ V
        m = m_new
    has = l_sum > 0
    safe = torch.where(has, l_sum, 1.0)
    return acc / safe[:, None], torch.where(has, (m + torch.log2(safe)) / LOG2E, -math.inf)


def combine(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """_combine_kernel for one sequence: the chunks merged by their lse; a row no chunk saw: 0, +inf."""
    lse = torch.stack(lses)  # [chunks, rows]
    top = lse.amax(dim=0)
    shift = torch.where(torch.isneginf(top), 0.0, top)
    w = torch.exp(lse - shift)
    total = w.sum(dim=0)
    acc = (w[:, :, None] * torch.stack(outs)).sum(dim=0)
    has = total > 0
    safe = torch.where(has, total, 1.0)
    return acc / safe[:, None], torch.where(has, shift + torch.log(safe), math.inf)


def gpu_path_decode(inp: DecodeInputs, target: str = "sm_90a") -> tuple[torch.Tensor, torch.Tensor]:
    """mla_decode_triton's default launch on `target`, in torch with the GPU's roundings."""
    b, s_q, h_q, _ = inp.q.shape
    rows = s_q * h_q
    block_m, block_n = default_tiles(rows, inp.kv_cache.shape[1], kv_format_of(inp.kv_cache), target)
    units = default_num_units(DEFAULT_NUM_SMS, -(-rows // block_m))
    plan: SplitPlan = balanced_plan(inp.seqlens, num_units=units, block=block_n)
    out = torch.empty(b, s_q, h_q, D_V, dtype=torch.bfloat16)
    lse = torch.empty(b, h_q, s_q)
    scale_log2 = inp.softmax_scale * LOG2E
    for i, n in enumerate(inp.seqlens):
        q = bf16(inp.q[i].reshape(rows, -1).float())  # row = token x h_q + head, as the kernel
        k = kernel_k(inp, i, n)
        limit = n - s_q + torch.arange(rows) // h_q + 1
        lo, hi = plan.seq_chunks[i].item(), plan.seq_chunks[i + 1].item()
        parts = [
            split_partial(
                q, k, limit, plan.chunk_start[c].item(), plan.chunk_end[c].item(), block_n, scale_log2
            )
            for c in range(lo, hi)
        ]
        o, row_lse = combine([p[0] for p in parts], [p[1] for p in parts])
        out[i] = o.reshape(s_q, h_q, D_V).to(torch.bfloat16)
        lse[i] = row_lse.reshape(s_q, h_q).T
    return out, lse


LENGTHS = [1, 15, 16, 17, 70, 300, 512, 1024, 4096]


def inputs(seqlens: list[int], *, s_q: int, kv_dtype: str, seed: int) -> DecodeInputs:
    return build_decode_inputs(seqlens, h_q=16, s_q=s_q, page_size=64, kv_dtype=kv_dtype, seed=seed)


@pytest.mark.parametrize("kv_dtype", ["fp8_flashmla", "bf16"])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("seqlen", LENGTHS)
def test_gpu_arithmetic_meets_flashmlas_rule_against_the_reference(seqlen, s_q, kv_dtype):
    inp = inputs([seqlen], s_q=s_q, kv_dtype=kv_dtype, seed=seqlen)
    out, lse = gpu_path_decode(inp)
    ref = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    res = check_decode(out, lse, *ref)
    assert res.passed, res.message


def test_unit_v_entries_would_break_the_rule():
    # why the family draws V at FlashMLA's scale: x10 on the cache and /10 on q leaves the scores as they
    # are, and the bf16 rounding of P then puts elements past the absolute limit at a short context
    inp = inputs([17], s_q=2, kv_dtype="bf16", seed=17)
    inp.kv_cache.mul_(10.0)
    inp.q.div_(10.0)
    res = check_decode(
        *gpu_path_decode(inp), *mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    )
    assert not res.out.passed, res.message


def test_the_imitation_splits_long_sequences_and_merges_them():
    # the merge is exercised: at 4096 tokens and 16 rows the default plan cuts the sequence into many chunks
    inp = inputs([4096, 3], s_q=2, kv_dtype="fp8_flashmla", seed=1)
    units = default_num_units(DEFAULT_NUM_SMS, 2)
    plan = balanced_plan(inp.seqlens, num_units=units, block=16)
    assert plan.seq_chunks[1].item() - plan.seq_chunks[0].item() > 8
    out, lse = gpu_path_decode(inp)
    res = check_decode(
        out, lse, *mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens)
    )
    assert res.passed, res.message
    assert torch.isfinite(lse).all()


def test_the_kernels_k_operands_are_the_references_k():
    # the fp8 NoPE x its tile's scale, rounded to bf16 as the kernel does on a GPU, is exactly the K the
    # reference computes with: the scales are powers of two, so nothing is rounded at all
    inp = build_decode_inputs([70, 17], h_q=1, page_size=16, kv_dtype="fp8_flashmla", seed=3)
    for b, n in enumerate(inp.seqlens):
        want = gather_kv(inp.kv_cache, inp.block_table, n, b)
        assert torch.equal(kernel_k(inp, b, n), want)
