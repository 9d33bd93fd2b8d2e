"""The paged KV cache manager: a pool of fixed-size pages, block tables, prefix sharing and LRU eviction.

Model (vLLM-style prefix caching, own code):
- Every sequence owns an ordered list of physical pages (its block table). Tokens are appended in order;
  only the last page of a sequence may be partially filled, and that page is private.
- A page that becomes full gets a content hash chained on its prefix: hash(page k) = H(hash(page k-1),
  token ids of page k). Two pages with the same hash therefore hold the same tokens after the same prefix.
- When an append covers a whole page starting at a page boundary, the cache first looks the page's hash
  up: a cached page with that hash is reused (a hit: ref count + 1, no write, no new page); otherwise a
  fresh page is allocated and written (a miss). Only such whole-page lookups count as hits or misses;
  partial pages are plain allocations.
- Shared pages are always full, so an append never writes into a page another sequence can see.
- Freeing a sequence drops its references. A page whose ref count reaches 0 stays cached (evictable) if
  it has a hash, else it goes back to the free list. Pages are released tail first, so within one
  sequence the tail is evicted before the prefix.
- Allocation takes a free page first, then evicts the least recently released cached page.
- An append is planned before anything changes: if the pool cannot supply the pages it needs,
  `OutOfPagesError` is raised and the cache (every sequence, every page, every counter) is unchanged.

Counters: pages_allocated (fresh allocations, cumulative), hits, misses, evictions; derived: hit rate,
internal fragmentation = slots of in-use pages - tokens stored in them, bytes resident (in-use + cached
pages), bytes per token = bytes of in-use pages / live tokens (below the raw per-token size when
prefixes are shared).

With `store=True` the cache owns the data tensors the kernels read (`kv_cache [num_pages, page_size, 1,
head_dim]`, and for fp8 `kv_scales [num_pages, page_size]`; for fp8_flashmla `kv_cache [num_pages, page_size,
1, 656]` in FlashMLA's layout, kernels.common.mla.layout); every freshly allocated page is poisoned with
NaN before use, so unused slots are always NaN. With `store=False` it is bookkeeping only (trace replay).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from kernels.common.mla.layout import (
    D_QK,
    FLASHMLA_FP8_BYTES,
    INVALID_BLOCK_ID,
    kv_bytes_per_token,
    kv_torch_dtype,
    poison_flashmla,
    quantize_flashmla,
    quantize_fp8_per_token,
)

_ROOT_HASH = b"\x00" * 16


class OutOfPagesError(RuntimeError):
    """The pool cannot supply the pages an append needs. Nothing was changed."""

    def __init__(self, seq_id: Hashable, needed: int, available: int, num_pages: int, page_size: int):
        self.seq_id = seq_id
        self.needed = needed
        self.available = available
        super().__init__(
            f"KV cache out of pages for sequence {seq_id!r}: needs {needed} new page(s) but only "
            f"{available} are free or evictable (pool of {num_pages} pages x {page_size} tokens); "
            "the cache was left unchanged"
        )


def chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Identity of a full page: its tokens and, through `parent`, everything before it."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


@dataclass(frozen=True)
class AppendResult:
    hits: int
    misses: int
    new_pages: int


@dataclass(frozen=True)
class CacheStats:
    page_size: int
    num_pages: int
    pages_in_use: int
    pages_cached: int  # ref count 0 but kept for prefix reuse (evictable)
    pages_free: int
    pages_allocated: int  # cumulative fresh allocations
    hits: int
    misses: int
    evictions: int
    live_sequences: int
    live_tokens: int
    allocated_slots: int  # pages_in_use * page_size
    fragmentation: int  # allocated_slots - tokens stored in in-use pages
    page_bytes: int
    bytes_in_use: int
    bytes_resident: int  # in-use + cached pages
    bytes_per_token: float  # bytes_in_use / live_tokens (0 when empty)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


@dataclass
class KernelTensors:
    kv_cache: torch.Tensor  # [num_pages, page_size, 1, head_dim]
    block_table: torch.Tensor  # [batch, max_blocks] int32, unused = INVALID_BLOCK_ID
    cache_seqlens: torch.Tensor  # [batch] int32
    kv_scales: torch.Tensor | None  # [num_pages, page_size] fp32 for fp8, else None


@dataclass
class _Seq:
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0
    tail_tokens: list[int] = field(default_factory=list)  # tokens of the partial last page
    last_hash: bytes = _ROOT_HASH  # chain hash of the last full page


@dataclass(frozen=True)
class _Step:
    kind: str  # "tail" (fill the partial last page), "hit", "full" (miss), "partial"
    src: int  # first row of the appended chunk covered by this step
    count: int
    page: int = -1  # known page for "tail" and "hit"
    hash: bytes | None = None  # chain hash when the step completes a page


class PagedKVCache:
    def __init__(
        self,
        num_pages: int,
        page_size: int = 64,
        *,
        head_dim: int = D_QK,
        kv_dtype: str = "bf16",
        device: str | torch.device = "cpu",
        store: bool = True,
        page_order: Sequence[int] | None = None,
    ) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.head_dim = head_dim
        self.kv_dtype = kv_dtype
        self.store = store
        self.page_bytes = page_size * kv_bytes_per_token(kv_dtype, head_dim)
        self._flashmla = kv_dtype == "fp8_flashmla"
        order = list(range(num_pages)) if page_order is None else list(page_order)
        if sorted(order) != list(range(num_pages)):
            raise ValueError("page_order must be a permutation of range(num_pages)")
        self._free: deque[int] = deque(order)
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._ref = [0] * num_pages
        self._fill = [0] * num_pages
        self._page_hash: list[bytes | None] = [None] * num_pages
        self._by_hash: dict[bytes, int] = {}
        self._seqs: dict[Hashable, _Seq] = {}
        self._in_use = 0
        self._used_slots = 0
        self._live_tokens = 0
        self._pages_allocated = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self.kv: torch.Tensor | None = None
        self.scales: torch.Tensor | None = None
        self._dirty = [False] * num_pages  # written since it was last poisoned
        if store:
            dtype = kv_torch_dtype(kv_dtype)
            shape = (num_pages, page_size, 1, head_dim)
            if self._flashmla:  # FlashMLA's 656-byte tokens (kernels.common.mla.layout)
                self.kv = torch.empty(shape[:3] + (FLASHMLA_FP8_BYTES,), dtype=dtype, device=device)
                poison_flashmla(self.kv)
            elif kv_dtype == "fp8":  # 0x7F is e4m3fn's NaN
                self.kv = torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
                self.scales = torch.full((num_pages, page_size), float("nan"), device=device)
            else:
                self.kv = torch.full(shape, float("nan"), dtype=dtype, device=device)

    # ----------------------------------------------------------------- sequences
    @property
    def sequences(self) -> list[Hashable]:
        return list(self._seqs)

    def seqlen(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def block_ids(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).pages)

    def ref_count(self, page: int) -> int:
        return self._ref[page]

    def add_sequence(
        self, seq_id: Hashable, tokens: Sequence[int] = (), kv: torch.Tensor | None = None
    ) -> AppendResult:
        """Start a sequence with a prompt. On OutOfPagesError the sequence is not created."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        self._seqs[seq_id] = _Seq()
        try:
            return self.append(seq_id, tokens, kv)
        except BaseException:
            del self._seqs[seq_id]
            raise

    def append(self, seq_id: Hashable, tokens: Sequence[int], kv: torch.Tensor | None = None) -> AppendResult:
        """Append tokens (and, with store=True, their KV rows [len(tokens), head_dim]) to a sequence."""
        seq = self._seq(seq_id)
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        if self.store and n:
            if kv is None or kv.shape != (n, self.head_dim):
                got = None if kv is None else tuple(kv.shape)
                raise ValueError(f"kv must have shape ({n}, {self.head_dim}) for store=True, got {got}")
        steps = self._plan(seq, tokens)
        hit_pages = [s.page for s in steps if s.kind == "hit"]
        needed = sum(1 for s in steps if s.kind in ("full", "partial"))
        reclaimable = sum(1 for p in hit_pages if p in self._evictable)
        available = len(self._free) + len(self._evictable) - reclaimable
        if needed > available:
            raise OutOfPagesError(seq_id, needed, available, self.num_pages, self.page_size)
        for page in hit_pages:  # claim hits first so the allocations below cannot evict them
            self._acquire(page)
        rows: list[int] = []
        slots: list[int] = []
        for s in steps:
            if s.kind == "hit":
                page = s.page
                self._hits += 1
            else:
                page = s.page if s.kind == "tail" else self._allocate()
                if s.kind == "full":
                    self._misses += 1
                first = self._fill[page]
                self._dirty[page] = True
                rows.extend(range(s.src, s.src + s.count))
                slots.extend(page * self.page_size + first + j for j in range(s.count))
                self._fill[page] += s.count
                self._used_slots += s.count
                if s.hash is not None and s.hash not in self._by_hash:
                    self._by_hash[s.hash] = page
                    self._page_hash[page] = s.hash
            if s.kind != "tail":
                seq.pages.append(page)
            if s.hash is not None:
                seq.last_hash = s.hash
        seq.num_tokens += n
        self._live_tokens += n
        rem = seq.num_tokens % self.page_size
        seq.tail_tokens = tokens[n - rem :] if rem and rem <= n else (seq.tail_tokens + tokens if rem else [])
        if self.store and rows:
            self._write(kv, rows, slots)
        return AppendResult(
            hits=len(hit_pages), misses=sum(1 for s in steps if s.kind == "full"), new_pages=needed
        )

    def free_sequence(self, seq_id: Hashable) -> None:
        """Finish a sequence: release its pages tail first (hashed pages stay cached until evicted)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id!r}")
        self._live_tokens -= seq.num_tokens
        for page in reversed(seq.pages):
            self._ref[page] -= 1
            if self._ref[page] == 0:
                self._in_use -= 1
                self._used_slots -= self._fill[page]
                if self._page_hash[page] is not None:
                    self._evictable[page] = None
                else:
                    self._fill[page] = 0
                    self._free.append(page)

    # ----------------------------------------------------------------- outputs
    def stats(self) -> CacheStats:
        allocated_slots = self._in_use * self.page_size
        resident = self._in_use + len(self._evictable)
        return CacheStats(
            page_size=self.page_size,
            num_pages=self.num_pages,
            pages_in_use=self._in_use,
            pages_cached=len(self._evictable),
            pages_free=len(self._free),
            pages_allocated=self._pages_allocated,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            live_sequences=len(self._seqs),
            live_tokens=self._live_tokens,
            allocated_slots=allocated_slots,
            fragmentation=allocated_slots - self._used_slots,
            page_bytes=self.page_bytes,
            bytes_in_use=self._in_use * self.page_bytes,
            bytes_resident=resident * self.page_bytes,
            bytes_per_token=(self._in_use * self.page_bytes / self._live_tokens)
            if self._live_tokens
            else 0.0,
        )

    def kernel_inputs(
        self, seq_ids: Sequence[Hashable] | None = None, *, max_blocks: int | None = None, pad_blocks: int = 0
    ) -> KernelTensors:
        """The tensors the decode kernels take, for `seq_ids` in order (default: all live sequences)."""
        if self.kv is None:
            raise RuntimeError("kernel_inputs needs a cache built with store=True")
        ids = list(self._seqs) if seq_ids is None else list(seq_ids)
        seqs = [self._seq(i) for i in ids]
        need = max((len(s.pages) for s in seqs), default=0)
        width = max(need + pad_blocks, 1) if max_blocks is None else max_blocks
        if width < need:
            raise ValueError(f"max_blocks={max_blocks} is below the {need} pages the longest sequence uses")
        table = torch.full((len(seqs), width), INVALID_BLOCK_ID, dtype=torch.int32)
        for row, s in enumerate(seqs):
            table[row, : len(s.pages)] = torch.tensor(s.pages, dtype=torch.int32)
        seqlens = torch.tensor([s.num_tokens for s in seqs], dtype=torch.int32)
        dev = self.kv.device
        return KernelTensors(self.kv, table.to(dev), seqlens.to(dev), self.scales)

    # ----------------------------------------------------------------- internals
    def _seq(self, seq_id: Hashable) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _plan(self, seq: _Seq, tokens: list[int]) -> list[_Step]:
        P = self.page_size
        steps: list[_Step] = []
        i = 0
        parent = seq.last_hash
        used = seq.num_tokens % P
        if used and tokens:
            k = min(P - used, len(tokens))
            h = chain_hash(parent, seq.tail_tokens + tokens[:k]) if used + k == P else None
            steps.append(_Step("tail", 0, k, page=seq.pages[-1], hash=h))
            parent = h or parent
            i = k
        while i < len(tokens):
            k = min(P, len(tokens) - i)
            if k < P:
                steps.append(_Step("partial", i, k))
            else:
                h = chain_hash(parent, tokens[i : i + P])
                page = self._by_hash.get(h)
                if page is not None:
                    steps.append(_Step("hit", i, k, page=page, hash=h))
                else:
                    steps.append(_Step("full", i, k, hash=h))
                parent = h
            i += k
        return steps

    def _acquire(self, page: int) -> None:
        if self._ref[page] == 0:
            self._evictable.pop(page, None)
            self._in_use += 1
            self._used_slots += self._fill[page]
        self._ref[page] += 1

    def _allocate(self) -> int:
        if self._free:
            page = self._free.popleft()
        else:
            page, _ = self._evictable.popitem(last=False)  # least recently released
            old = self._page_hash[page]
            if old is not None:
                del self._by_hash[old]
            self._page_hash[page] = None
            self._evictions += 1
        self._pages_allocated += 1
        self._ref[page] = 1
        self._fill[page] = 0
        self._in_use += 1
        if self.kv is not None and self._dirty[page]:
            if self._flashmla:
                poison_flashmla(self.kv[page])
            else:
                self.kv[page] = float("nan")
            if self.scales is not None:
                self.scales[page] = float("nan")
            self._dirty[page] = False
        return page

    def _write(self, kv: torch.Tensor, rows: list[int], slots: list[int]) -> None:
        assert self.kv is not None
        dev = self.kv.device
        src = kv[torch.tensor(rows, device=kv.device)].to(dev)
        idx = torch.tensor(slots, device=dev)
        flat = self.kv.view(-1, self.kv.shape[-1])
        if self._flashmla:
            flat[idx] = quantize_flashmla(src)
        elif self.scales is not None:
            q, scale = quantize_fp8_per_token(src)
            flat[idx] = q
            self.scales.view(-1)[idx] = scale
        else:
            flat[idx] = src.to(self.kv.dtype)
