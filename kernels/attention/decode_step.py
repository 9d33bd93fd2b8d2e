"""One MLA decode step over the paged KV cache of kernels.paged_mla: append every sequence's new token
to the cache, then attend. Timing `DecodeStepper.step` gives one number in which a regression of either
the cache append (host bookkeeping + KV write) or the attention kernel shows up.

A step, for a batch of sequences of `context` tokens:
  1. `PagedKVCache.append(seq, [token], kv_row)` for each sequence (the new token's 576-channel row);
  2. `kernel_inputs` (block table and seqlens, fixed width) for the batch;
  3. attention of one query token per sequence over the cache (`attend(q, tensors)`).
So that repeated timing does not drift to longer and longer contexts, the sequences are rewound every
`window` steps: each is freed and re-added with its prompt, whose full pages come back as prefix hits
(no rewrite) and only the partial last page is written. The step that rewinds is an outlier by design
(1 in `window` samples); the farm judges medians.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.paged_mla.cache import KernelTensors, PagedKVCache
from kernels.paged_mla.layout import D_QK, D_V

Attend = Callable[[torch.Tensor, KernelTensors], tuple[torch.Tensor, torch.Tensor]]
KV_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class StepState:
    """What the attention of the last step saw (for checking it against a reference)."""

    q: torch.Tensor
    tensors: KernelTensors


class DecodeStepper:
    def __init__(
        self,
        batch: int,
        context: int,
        h_q: int,
        *,
        page_size: int = 64,
        window: int = 64,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        if dtype not in KV_DTYPES:
            raise ValueError(f"the paged cache holds bf16 or fp16, got {dtype}")
        if batch < 1 or context < 1 or window < 1:
            raise ValueError(f"batch, context and window must be >= 1 ({batch}, {context}, {window})")
        self.batch, self.context, self.window = batch, context, window
        self.page_size = page_size
        self.softmax_scale = 1.0 / math.sqrt(D_QK)
        gen = torch.Generator().manual_seed(seed)
        pages_per_seq = -(-(context + window) // page_size) + 1
        # Two sets of pages per sequence: freed prompt pages stay cached (for the prefix hits) while
        # the appended tail pages are reallocated.
        self.cache = PagedKVCache(
            2 * batch * pages_per_seq, page_size, head_dim=D_QK, kv_dtype=KV_DTYPES[dtype], device=device
        )
        self.max_blocks = pages_per_seq
        self._ids = [torch.randint(0, 2**31 - 1, (context,), generator=gen).tolist() for _ in range(batch)]
        self._kv = [torch.randn(context, D_QK, generator=gen).to(device) for _ in range(batch)]
        self._new_ids = torch.randint(0, 2**31 - 1, (window, batch), generator=gen).tolist()
        self._new_kv = torch.randn(window, batch, D_QK, generator=gen).to(device)
        self.q = torch.randn(batch, 1, h_q, D_QK, generator=gen).to(dtype=dtype, device=device)
        for i in range(batch):
            self.cache.add_sequence(i, self._ids[i], self._kv[i])
        self._step = 0
        self.rewinds = 0
        self.last: StepState | None = None

    def _rewind(self) -> None:
        for i in range(self.batch):
            self.cache.free_sequence(i)
            self.cache.add_sequence(i, self._ids[i], self._kv[i])
        self._step = 0
        self.rewinds += 1

    def step(self, attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one token to every sequence, then attend over the cache."""
        if self._step == self.window:
            self._rewind()
        s = self._step
        for i in range(self.batch):
            self.cache.append(i, [self._new_ids[s][i]], self._new_kv[s, i : i + 1])
        tensors = self.cache.kernel_inputs(list(range(self.batch)), max_blocks=self.max_blocks)
        self._step += 1
        self.last = StepState(self.q, tensors)
        return attend(self.q, tensors)

    @property
    def seqlens(self) -> list[int]:
        return [self.cache.seqlen(i) for i in range(self.batch)]


def reference_attend(softmax_scale: float) -> Attend:
    from kernels.paged_mla.reference import mla_decode_reference

    def attend(q: torch.Tensor, t: KernelTensors) -> tuple[torch.Tensor, torch.Tensor]:
        return mla_decode_reference(
            q, t.kv_cache, t.block_table, t.cache_seqlens, softmax_scale=softmax_scale, d_v=D_V
        )

    return attend


def triton_attend(softmax_scale: float, **kwargs) -> Attend:
    from kernels.paged_mla.triton_decode import mla_decode_triton

    def attend(q: torch.Tensor, t: KernelTensors) -> tuple[torch.Tensor, torch.Tensor]:
        return mla_decode_triton(
            q, t.kv_cache, t.block_table, t.cache_seqlens, softmax_scale=softmax_scale, d_v=D_V, **kwargs
        )

    return attend
