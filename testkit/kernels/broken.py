"""Kernels broken on purpose, built on the product's own, for tests that show a correctness check
catches them. Nothing here changes a product kernel: the fault is in what the kernel is told."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Attention = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def off_by_one_causal(flash: Attention) -> Attention:
    """`flash` (kernels.attention.triton_prefill.flash_attention_triton's signature) with the causal
    diagonal one key to the right: every query also sees the next key. The kernel is bottom-right
    aligned, so it is run with one key more per sequence (a zero key, past each sequence's end); the last
    query row, the one that would see that extra key, already sees every key and keeps its true result."""

    def shifted(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not causal:
            return flash(q, k, v, causal=False, **kw)
        b = q.shape[0]
        lens = kw.pop("seqlens_k", None)
        lens = torch.full((b,), k.shape[1], dtype=torch.int32) if lens is None else lens.to(torch.int32)
        seqs, ends = torch.arange(b), lens.long().cpu()
        padded = []
        for x in (k, v):
            x = torch.cat([x, x.new_zeros(b, 1, *x.shape[2:])], dim=1)
            x[seqs, ends] = 0  # the key past each end: finite, whatever the sequence's tail holds
            padded.append(x)
        out, lse = flash(q, *padded, seqlens_k=(lens + 1).to(q.device), **kw)
        true_out, true_lse = flash(q, k, v, seqlens_k=lens.to(q.device), **kw)
        out[:, -1], lse[..., -1] = true_out[:, -1], true_lse[..., -1]
        return out, lse

    return shifted


def overread_lengths(
    cache_seqlens: torch.Tensor, seqlens: list[int], n: int
) -> tuple[torch.Tensor, list[int]]:
    """A paged decode's lengths as an over-reading kernel takes them: n tokens past every sequence's end
    (the slots there are whatever the cache holds: NaN where the tests poison unused slots)."""
    return cache_seqlens + n, [s + n for s in seqlens]


def overreading_decode(decode: Attention, n: int = 1) -> Attention:
    """`decode` (kernels.common.mla.triton_decode.mla_decode_triton's signature) reading n slots past every
    sequence's end."""

    def overread(
        q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return decode(q, kv_cache, block_table, lens + n, **kw)

    return overread
