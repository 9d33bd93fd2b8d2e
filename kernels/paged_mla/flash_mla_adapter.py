"""Adapter to the FlashMLA library (`flash_mla` package), for GPU hosts that have it installed.

Written from FlashMLA's documented decode interface (no code taken from it):
  metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
  out, lse = flash_mla_with_kvcache(q, kv_cache, block_table, cache_seqlens, d_v, metadata, num_splits,
                                    causal=True)
with the same layout as kernels.paged_mla (q [b, s_q, h_q, 576] bf16, cache [blocks, 64, 1, 576] bf16,
block_table int32, cache_seqlens int32; out [b, s_q, h_q, 512], lse [b, h_q, s_q] fp32). The dense decode
path takes a bf16 cache with page size 64 only. Untested here: it needs a Hopper GPU and the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

FLASH_MLA_PAGE_SIZE = 64
FLASH_MLA_KV_DTYPES = ("bf16",)


def unavailable_reason() -> str | None:
    """Why the flash_mla backend cannot run here, or None (the family's availability check)."""
    if not torch.cuda.is_available():
        return "the flash_mla backend needs a CUDA GPU; none is available on this worker"
    try:
        module = importlib.import_module("flash_mla")
    except ImportError as err:
        return f"the flash_mla backend needs the FlashMLA package (`import flash_mla` failed: {err})"
    for name in ("get_mla_metadata", "flash_mla_with_kvcache"):
        if not hasattr(module, name):
            return f"the installed flash_mla has no {name}(): unsupported version"
    return None


def load_flash_mla() -> Any:
    """The flash_mla module; RuntimeError saying why when it cannot run here."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    return importlib.import_module("flash_mla")


def flash_mla_decode_fn(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    d_v: int,
    softmax_scale: float,
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A no-argument decode call. The scheduling metadata is computed once here, outside the timed call,
    as a serving engine computes it once per step for all layers."""
    fm = load_flash_mla()
    s_q, h_q = q.shape[1], q.shape[2]
    h_kv = kv_cache.shape[2]
    seqlens = cache_seqlens.to(torch.int32)
    table = block_table.to(torch.int32)
    metadata, num_splits = fm.get_mla_metadata(seqlens, s_q * h_q // h_kv, h_kv)

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        return fm.flash_mla_with_kvcache(
            q, kv_cache, table, seqlens, d_v, metadata, num_splits, softmax_scale=softmax_scale, causal=True
        )

    return call
