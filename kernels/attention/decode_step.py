"""One MLA decode step over the paged KV cache of kernels.common.mla: append every sequence's new token
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

from kernels.common.mla.cache import KernelTensors, PagedKVCache
from kernels.common.mla.layout import D_QK, D_V

DEFAULT_WINDOW = 64  # steps between rewinds
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
        window: int = DEFAULT_WINDOW,
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

    def seeded(self) -> tuple[torch.Tensor, ...]:
        """The seeded tensors every step reads: the queries and the window's new-token rows (a step
        appends one of them). Not the cache, whose pages follow the steps taken as well as the seed, nor
        the prompts' rows, which only a rewind reads again."""
        return self.q, self._new_kv

    @property
    def seqlens(self) -> list[int]:
        return [self.cache.seqlen(i) for i in range(self.batch)]


def exact_attend(softmax_scale: float) -> Attend:
    """The correctness reference of a step: every sequence's cached rows gathered (exact: the cache holds
    bf16/fp16) and attended in fp64 by kernels.attention.reference. lse is the natural log; a row that
    sees no key (an empty sequence) gets out 0 and lse +inf (kernels.common.lse: FlashMLA's convention,
    which the paged MLA reference follows too)."""
    from kernels.attention.reference import masked_attention
    from kernels.common.lse import EMPTY_ROW_LSE, EMPTY_ROW_OUT
    from kernels.common.mla.reference import gather_kv

    def attend(q: torch.Tensor, t: KernelTensors) -> tuple[torch.Tensor, torch.Tensor]:
        b, s_q, h_q, _ = q.shape
        out = torch.full((b, s_q, h_q, D_V), EMPTY_ROW_OUT, dtype=torch.float64, device=q.device)
        lse = torch.full((b, h_q, s_q), EMPTY_ROW_LSE, dtype=torch.float64, device=q.device)
        for i, n in enumerate(t.cache_seqlens.tolist()):
            if n <= 0:
                continue
            kv = gather_kv(t.kv_cache, t.block_table, n, i).to(q.device)[None, :, None, :]
            mask = torch.ones(1, s_q, n, dtype=torch.bool, device=q.device)
            o, row_lse = masked_attention(q[i : i + 1], kv, kv[..., :D_V], mask, softmax_scale, torch.float64)
            out[i], lse[i] = o[0], row_lse[0]
        return out, lse

    return attend


def sdpa_attend(softmax_scale: float) -> tuple[Attend, dict[str, str]]:
    """The torch baseline of a step: gather the block table's pages into a contiguous [b, S, 1, 576]
    (zeroed past each length) and run SDPA with a length mask. Returns the attend function and a dict
    that names the SDPA backends it ended up using (filled after the first call)."""
    from kernels.attention.sdpa import Sdpa

    used: dict[str, str] = {}

    def attend(q: torch.Tensor, t: KernelTensors):
        b = q.shape[0]
        pages = t.block_table.long().clamp(0, t.kv_cache.shape[0] - 1)  # unused entries are sentinels
        kv = t.kv_cache[pages].reshape(b, -1, 1, D_QK)
        present = torch.arange(kv.shape[1], device=q.device)[None, :] < t.cache_seqlens.to(q.device)[:, None]
        kv = torch.where(present[:, :, None, None], kv, 0)
        call = Sdpa(q, kv, kv[..., :D_V], softmax_scale, mask=present[:, None, None, :])
        call.backends = used_backends(q.device, used)
        result = call()
        used.update(call.describe())
        return result

    return attend, used


def used_backends(device: torch.device, used: dict[str, str]) -> list:
    """The SDPA backends a step starts from: the preferred ones, or math once they were refused."""
    from torch.nn.attention import SDPBackend

    from kernels.attention.sdpa import preferred_backends

    return [SDPBackend.MATH] if used.get("sdpa_fallback") else preferred_backends(device)


def reference_attend(softmax_scale: float) -> Attend:
    from kernels.common.mla.reference import mla_decode_reference

    def attend(q: torch.Tensor, t: KernelTensors) -> tuple[torch.Tensor, torch.Tensor]:
        return mla_decode_reference(
            q, t.kv_cache, t.block_table, t.cache_seqlens, softmax_scale=softmax_scale, d_v=D_V
        )

    return attend


def triton_attend(softmax_scale: float, **kwargs) -> Attend:
    from kernels.common.mla.triton_decode import mla_decode_triton

    def attend(q: torch.Tensor, t: KernelTensors) -> tuple[torch.Tensor, torch.Tensor]:
        return mla_decode_triton(
            q, t.kv_cache, t.block_table, t.cache_seqlens, softmax_scale=softmax_scale, d_v=D_V, **kwargs
        )

    return attend
