"""The decode step's exact reference gives an empty sequence lse +inf (FlashMLA's value, kernels.common.lse),
as the paged MLA reference does, so the two references agree on empty rows."""

from __future__ import annotations

import math

import torch

from kernels.attention.decode_step import exact_attend
from kernels.common.lse import EMPTY_ROW_LSE
from kernels.common.mla.cache import KernelTensors
from kernels.common.mla.layout import D_QK, D_V, INVALID_BLOCK_ID
from kernels.common.mla.reference import mla_decode_reference


def test_exact_attend_gives_plus_inf_lse_and_zero_out_for_an_empty_sequence():
    g = torch.Generator().manual_seed(0)
    page = 16
    kv = torch.randn(2, page, 1, D_QK, generator=g).to(torch.bfloat16)
    table = torch.tensor([[0, INVALID_BLOCK_ID], [INVALID_BLOCK_ID, INVALID_BLOCK_ID]], dtype=torch.int32)
    t = KernelTensors(kv, table, torch.tensor([5, 0], dtype=torch.int32), None)
    q = torch.randn(2, 1, 4, D_QK, generator=g).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(D_QK)

    out, lse = exact_attend(scale)(q, t)

    assert torch.all(lse[1] == EMPTY_ROW_LSE) and EMPTY_ROW_LSE == float("inf")
    assert torch.all(out[1] == 0)
    assert torch.isfinite(lse[0]).all()
    ref_out, ref_lse = mla_decode_reference(q, kv, table, t.cache_seqlens, softmax_scale=scale, d_v=D_V)
    assert torch.equal(lse[1].float(), ref_lse[1])
    torch.testing.assert_close(lse[0].float(), ref_lse[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.float(), ref_out, rtol=1e-4, atol=1e-4)
