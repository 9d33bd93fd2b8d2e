"""The log-sum-exp convention every attention-like family returns (attention, paged MLA), FlashMLA's.

lse [b, h_q, s_q] fp32 is the natural logarithm (base e) of the softmax denominator over the keys a
query row sees, with the softmax scale applied to the scores first: lse = log(sum_j exp(scale * q.k_j)).
Kernels that run their online softmax in base 2 (exp2 with scale * log2(e)) convert back before they
store it.

Empty rows: a row that sees no key (a zero-length sequence, a causal query earlier than every key, or a
sparse row whose indices are all padding) returns out = EMPTY_ROW_OUT (0) and lse = EMPTY_ROW_LSE (+inf),
as FlashMLA's kernels and references do (they write +inf where the softmax sum is 0, so that a later
merge weighting by exp(-lse) gives the row no weight). Inside a split-KV kernel the partial lse of an
empty split stays -inf (the log-sum-exp of an empty set) so that the combine weights it by zero; only the
final lse of a row that no split saw becomes +inf.
"""

from __future__ import annotations

import math

import torch

EMPTY_ROW_LSE = float("inf")
EMPTY_ROW_OUT = 0.0


def finish_empty_rows(lse: torch.Tensor) -> torch.Tensor:
    """lse with the log-sum-exp of an empty set (-inf) replaced by EMPTY_ROW_LSE (same dtype, device)."""
    return torch.where(torch.isneginf(lse), torch.full_like(lse, EMPTY_ROW_LSE), lse)


def scale_of(d: int, softmax_scale: float | None) -> float:
    """The softmax scale applied to the scores: `softmax_scale` when given, else 1 / sqrt(d)."""
    return 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
