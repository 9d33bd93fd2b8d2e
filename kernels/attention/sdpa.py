"""The dense baseline: torch's scaled_dot_product_attention (SDPA) on the family's layouts.

On a GPU the flash and memory-efficient backends are allowed (torch picks one per call); where neither
accepts the inputs (a head dim flash does not support and a mask efficient refuses, say) the call falls
back to the math backend and says so in `Sdpa.backends`. On a CPU the math backend runs. The mask that
gives the family's semantics (kernels.attention.reference) is built once, outside the timed call:
  - s_q == s_k, every sequence full: `is_causal` (top-left and bottom-right alignment agree);
  - s_q == 1, every sequence full: no mask (the one query sees every key);
  - s_q < s_k, every sequence full: torch's lower-right causal bias (flash/efficient capable);
  - ragged lengths, or top-k indices that name each position at most once: an explicit boolean mask
    [b, 1, s_q, s_k];
  - top-k indices with a repeated position (counted once per slot, kernels.attention.reference): an
    additive mask in q's dtype, log(count) for a position named count times and -inf for one not named
    (softmax over slots = softmax over positions with + log count). In bf16 log count rounds (log 2 to
    0.691: weight 1.997 for 2), a few tenths of a percent in a repeated key's weight, within the out
    tolerance; negligible in fp32.
SDPA returns no log-sum-exp, so the baseline's lse is None and only its output is checked (a row that sees
no key should come out 0; which value SDPA gives there depends on its backend). Its inputs must not hold
NaN poison: a masked key still enters P @ V as 0 x NaN in the math backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from kernels.attention.reference import causal_mask, sparse_counts

FAST = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def preferred_backends(device: torch.device) -> list[SDPBackend]:
    return list(FAST) if device.type == "cuda" else [SDPBackend.MATH]


def _names(backends: list[SDPBackend]) -> str:
    return ",".join(b.name.lower() for b in backends)


@dataclass
class Sdpa:
    """One prepared SDPA call: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    softmax_scale: float
    mask: object = None  # None, a bool tensor [b, 1, s_q, s_k], or torch's causal bias
    is_causal: bool = False
    backends: list[SDPBackend] = field(default_factory=list)
    fallback: str | None = None  # why the fast backends were refused (GPU only)

    @classmethod
    def dense(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        seqlens_k: torch.Tensor | None,
    ) -> Sdpa:
        b, s_q = q.shape[:2]
        s_k = k.shape[1]
        call = cls(q, k, v, softmax_scale, backends=preferred_backends(q.device))
        if seqlens_k is not None:
            call.mask = causal_mask(s_q, s_k, seqlens_k, b, q.device)[:, None]
        elif s_q == s_k:
            call.is_causal = True
        elif s_q > 1:
            call.mask = causal_lower_right(s_q, s_k)
        return call

    @classmethod
    def sparse(
        cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, indices: torch.Tensor
    ) -> Sdpa:
        counts = sparse_counts(indices, k.shape[1])[:, None]
        repeats = bool((counts > 1).any())
        mask = torch.log(counts.float()).to(q.dtype) if repeats else counts > 0
        return cls(q, k, v, softmax_scale, mask=mask, backends=preferred_backends(q.device))

    def _sdpa(self) -> torch.Tensor:
        gqa = self.q.shape[2] != self.k.shape[2]
        return F.scaled_dot_product_attention(
            self.q.transpose(1, 2),
            self.k.transpose(1, 2),
            self.v.transpose(1, 2),
            attn_mask=self.mask,
            is_causal=self.is_causal,
            scale=self.softmax_scale,
            enable_gqa=gqa,
        )

    def __call__(self) -> tuple[torch.Tensor, None]:
        try:
            with sdpa_kernel(self.backends):
                out = self._sdpa()
        except RuntimeError as exc:
            if self.backends == [SDPBackend.MATH]:
                raise
            self.fallback = str(exc).splitlines()[0][:200]
            self.backends = [SDPBackend.MATH]
            with sdpa_kernel(self.backends):
                out = self._sdpa()
        return out.transpose(1, 2), None

    def describe(self) -> dict[str, str]:
        d = {"sdpa_backends": _names(self.backends)}
        if self.fallback:
            d["sdpa_fallback"] = f"{_names(FAST)} refused: {self.fallback}"
        return d
