"""Which program of the split-KV decode reads which cached tokens: a split plan, built on the host from
the sequence lengths once per batch (outside the timed call), as FlashMLA's get_mla_metadata does.

A plan cuts every sequence's tokens into chunks. A chunk is one contiguous token range [start, end) of
one sequence and gets one partial result (out, lse) per query row; the combine step merges the partials
of each sequence. Chunks are grouped into work units; the Triton kernel runs one program per chunk (and
row block), numbered so that a unit's chunks are neighbouring programs (a loop over a unit's chunks
inside one program spilled on sm_90a). Chunks are numbered sequence by sequence, so the chunks of
sequence b are seq_chunks[b] .. seq_chunks[b + 1] - 1 and those of unit u are unit_chunks[u] ..
unit_chunks[u + 1] - 1.

balanced_plan ("auto", FlashMLA's scheduling idea): the KV of the whole batch, counted in blocks of
`block` tokens (a partial last block counts as one), is dealt out over a fixed number of units (about one
per SM for each row block) in one pass over the (sequence, block) pairs in order, so each unit covers a
contiguous range of them and every unit gets floor or ceil of total / units blocks. A long sequence is cut
over many units and short ones share a unit, instead of every sequence taking the split count of the mean
length. (FlashMLA also charges a fixed cost per sequence a unit starts; this plan counts blocks only.)

uniform_plan (config num_splits = n): every sequence cut into n splits of whole pages, split s covering
pages [s * cdiv(P, n), (s + 1) * cdiv(P, n)) of its P pages, clipped to its length (possibly empty: a
split past the end reads nothing and its lse is -inf); one chunk per unit.

This module is pure torch and Python (no triton).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SplitPlan:
    """int32 tensors: unit_chunks [units + 1], seq_chunks [batch + 1], chunk_seq / chunk_start /
    chunk_end [chunks] (token offsets inside the sequence). `kind` is "balanced" or "uniform"."""

    kind: str
    block: int
    unit_chunks: torch.Tensor
    seq_chunks: torch.Tensor
    chunk_seq: torch.Tensor
    chunk_start: torch.Tensor
    chunk_end: torch.Tensor

    @property
    def num_units(self) -> int:
        return self.unit_chunks.numel() - 1

    @property
    def num_chunks(self) -> int:
        return self.chunk_seq.numel()

    @property
    def batch(self) -> int:
        return self.seq_chunks.numel() - 1

    def to(self, device: torch.device | str) -> SplitPlan:
        move = {k: getattr(self, k).to(device) for k in _TENSORS}
        return SplitPlan(self.kind, self.block, **move)

    def unit_blocks(self) -> list[int]:
        """The work of every unit: the `block`-token blocks of its chunks (a partial block counts one)."""
        starts, ends = self.chunk_start.tolist(), self.chunk_end.tolist()
        bounds = self.unit_chunks.tolist()
        return [
            sum(
                _cdiv(ends[c], self.block) - starts[c] // self.block
                for c in range(lo, hi)
                if ends[c] > starts[c]
            )
            for lo, hi in zip(bounds, bounds[1:], strict=False)
        ]

    def max_chunks_per_seq(self) -> int:
        counts = torch.diff(self.seq_chunks.cpu())
        return int(counts.max()) if counts.numel() else 0

    def describe(self) -> dict[str, object]:
        """What a trial records about the plan (metrics)."""
        work = self.unit_blocks()
        return {
            "split_plan": self.kind,
            "plan_units": self.num_units,
            "plan_chunks": self.num_chunks,
            "plan_max_unit_blocks": max(work, default=0),
            "plan_min_unit_blocks": min(work, default=0),
        }


_TENSORS = ("unit_chunks", "seq_chunks", "chunk_seq", "chunk_start", "chunk_end")


def _lengths(seqlens: torch.Tensor | list[int]) -> list[int]:
    lens = seqlens.tolist() if isinstance(seqlens, torch.Tensor) else [int(n) for n in seqlens]
    if any(n < 0 for n in lens):
        raise ValueError(f"sequence lengths must be >= 0, got {lens}")
    return lens


def _build(
    kind: str, block: int, batch: int, chunks: list[tuple[int, int, int]], units: list[int]
) -> SplitPlan:
    """chunks: (seq, start, end) in sequence order; units: the first chunk of every unit, then len(chunks)."""
    per_seq = [0] * (batch + 1)
    for b, _, _ in chunks:
        per_seq[b + 1] += 1
    for b in range(batch):
        per_seq[b + 1] += per_seq[b]

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    return SplitPlan(
        kind=kind,
        block=block,
        unit_chunks=i32(units),
        seq_chunks=i32(per_seq),
        chunk_seq=i32([c[0] for c in chunks]),
        chunk_start=i32([c[1] for c in chunks]),
        chunk_end=i32([c[2] for c in chunks]),
    )


def balanced_plan(seqlens: torch.Tensor | list[int], *, num_units: int, block: int) -> SplitPlan:
    """Deal the batch's `block`-token blocks over at most `num_units` units (fewer when there are fewer
    blocks), each a contiguous run of (sequence, block) pairs of floor or ceil of total / units blocks."""
    if num_units < 1 or block < 1:
        raise ValueError(f"num_units and block must be >= 1, got num_units={num_units}, block={block}")
    lens = _lengths(seqlens)
    blocks = [_cdiv(n, block) for n in lens]
    total = sum(blocks)
    units = max(1, min(num_units, total))
    chunks: list[tuple[int, int, int]] = []
    first: list[int] = []
    seq, done = 0, 0  # the next (sequence, block) pair to hand out
    for u in range(units):
        first.append(len(chunks))
        want = (u + 1) * total // units - u * total // units
        while want > 0:
            while blocks[seq] == done:  # skip finished (and empty) sequences
                seq, done = seq + 1, 0
            take = min(want, blocks[seq] - done)
            chunks.append((seq, done * block, min((done + take) * block, lens[seq])))
            done += take
            want -= take
    first.append(len(chunks))
    return _build("balanced", block, len(lens), chunks, first)


def uniform_plan(seqlens: torch.Tensor | list[int], *, num_splits: int, page_size: int) -> SplitPlan:
    """Every sequence in `num_splits` page-aligned splits (the pre-plan behaviour), one chunk per unit."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    lens = _lengths(seqlens)
    chunks = []
    for b, n in enumerate(lens):
        per = _cdiv(_cdiv(n, page_size), num_splits) * page_size
        chunks.extend((b, min(s * per, n), min((s + 1) * per, n)) for s in range(num_splits))
    return _build("uniform", page_size, len(lens), chunks, list(range(len(chunks) + 1)))


def default_num_units(num_sms: int, row_blocks: int) -> int:
    """Units so that units x row blocks fills the SMs about once (FlashMLA: SMs / row blocks)."""
    return max(1, num_sms // max(1, row_blocks))
