"""The one lse convention (kernels.common.lse): natural log, and an empty row's lse is +inf with out 0,
as FlashMLA returns it; every attention-like family's references and kernels follow it."""

from __future__ import annotations

import math

import torch

from kernels.common.lse import EMPTY_ROW_LSE, EMPTY_ROW_OUT, finish_empty_rows


def test_empty_rows_are_flashmlas_plus_inf_and_zero():
    assert EMPTY_ROW_LSE == math.inf and EMPTY_ROW_OUT == 0.0


def test_finish_empty_rows_turns_only_the_empty_set_into_plus_inf():
    lse = torch.tensor([[-math.inf, 0.5], [2.0, -math.inf]], dtype=torch.float64)
    done = finish_empty_rows(lse)
    assert done.dtype == torch.float64
    assert done.tolist() == [[math.inf, 0.5], [2.0, math.inf]]
    assert lse[0, 0] == -math.inf  # the input is left as it was
