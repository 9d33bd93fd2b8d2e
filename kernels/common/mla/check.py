"""Correctness of a decode result against the fp32 reference, by FlashMLA's rule (kernels.measure).

out: per element abs err <= 8e-4 or rel err <= 2.01/128, cosine-style diff <= 5e-6; lse: abs 1e-6 or rel
8.01/65536; NaN / inf positions must match. The fp32 reference output is first rounded to the kernel's
output dtype (bf16 normally), as FlashMLA's tests compare bf16 with bf16: the rel limit of ~2 bf16 ulps
is sized for that, and bf16 rounding alone costs ~1.5e-6 of the 5e-6 cosine budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.measure.correctness import FLASHMLA_LSE, FLASHMLA_OUT, CorrectnessReport, check_flashmla


@dataclass(frozen=True)
class DecodeCheck:
    out: CorrectnessReport
    lse: CorrectnessReport

    @property
    def passed(self) -> bool:
        return self.out.passed and self.lse.passed

    @property
    def message(self) -> str:
        return f"out: {self.out.message}; lse: {self.lse.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "out": self.out.to_dict(), "lse": self.lse.to_dict()}


def check_decode(
    out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor
) -> DecodeCheck:
    ref = ref_out.to(out.dtype) if out.dtype != ref_out.dtype else ref_out
    return DecodeCheck(
        out=check_flashmla(out.cpu(), ref.cpu(), **FLASHMLA_OUT),
        lse=check_flashmla(lse.cpu(), ref_lse.cpu(), **FLASHMLA_LSE),
    )
