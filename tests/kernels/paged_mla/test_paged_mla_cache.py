import pytest
import torch

from kernels.common.mla.cache import OutOfPagesError, PagedKVCache
from kernels.common.mla.layout import INVALID_BLOCK_ID

D = 8


def rows(n: int, start: float = 0.0) -> torch.Tensor:
    """KV rows whose every channel holds a distinct, bf16-exact value."""
    return (start + torch.arange(n, dtype=torch.float32))[:, None].repeat(1, D)


def slot_values(cache: PagedKVCache, seq: str) -> list[float]:
    assert cache.kv is not None
    vals = []
    for i in range(cache.seqlen(seq)):
        page = cache.block_ids(seq)[i // cache.page_size]
        vals.append(float(cache.kv[page, i % cache.page_size, 0, 0]))
    return vals


def test_append_across_page_boundaries():
    c = PagedKVCache(8, 4, head_dim=D)
    c.add_sequence("a", [1, 2, 3], rows(3))
    c.append("a", [4, 5], rows(2, 3))
    c.append("a", [6, 7, 8, 9, 10], rows(5, 5))
    assert c.seqlen("a") == 10
    pages = c.block_ids("a")
    assert len(pages) == 3 and len(set(pages)) == 3
    assert slot_values(c, "a") == [float(i) for i in range(10)]
    assert c.kv is not None and torch.isnan(c.kv[pages[2], 2:]).all()  # unused slots stay poisoned
    s = c.stats()
    assert (s.pages_in_use, s.pages_allocated, s.fragmentation, s.hits, s.misses) == (3, 3, 2, 0, 0)
    t = c.kernel_inputs(pad_blocks=1)
    assert t.block_table.tolist() == [pages + [INVALID_BLOCK_ID]]
    assert t.cache_seqlens.tolist() == [10] and t.block_table.dtype == torch.int32


def test_prefix_hits_share_pages_and_chain_on_prefix():
    c = PagedKVCache(16, 4, head_dim=D)
    prompt = list(range(100, 110))
    assert c.add_sequence("a", prompt, rows(10)).misses == 2
    r = c.add_sequence("b", prompt[:8] + [7, 7], rows(10, 50))
    assert (r.hits, r.misses, r.new_pages) == (2, 0, 1)
    assert c.block_ids("b")[:2] == c.block_ids("a")[:2]
    assert [c.ref_count(p) for p in c.block_ids("a")] == [2, 2, 1]
    assert slot_values(c, "b")[:8] == [float(i) for i in range(8)]  # shared pages were not rewritten
    # Same second page after a different first page: the chain hash differs, so no hit.
    r = c.add_sequence("c", [0, 0, 0, 0] + prompt[4:8], rows(8))
    assert (r.hits, r.misses) == (0, 2)
    s = c.stats()
    assert (s.hits, s.misses) == (2, 4) and s.hit_rate == pytest.approx(2 / 6)
    # A page filled token by token is registered once full and then reusable.
    c.add_sequence("d", [9, 9], rows(2))
    c.append("d", [9, 9], rows(2))
    assert c.add_sequence("e", [9, 9, 9, 9], rows(4)).hits == 1


def test_lru_eviction_order():
    c = PagedKVCache(4, 2, head_dim=D)
    c.add_sequence("a", [1, 2, 3, 4], rows(4))
    a_pages = c.block_ids("a")
    c.free_sequence("a")  # both pages stay cached; the tail is released (and so evicted) first
    c.add_sequence("b", [5, 6], rows(2))
    c.free_sequence("b")  # released after a's pages: most recent
    assert c.stats().pages_cached == 3 and c.stats().pages_free == 1
    c.add_sequence("x", [7, 8, 9, 10], rows(4))  # 2 pages: 1 free + evict a's tail
    s = c.stats()
    assert s.evictions == 1 and a_pages[1] in c.block_ids("x")
    assert c.add_sequence("a2", [1, 2], rows(2)).hits == 1  # a's head survived
    assert c.add_sequence("b2", [5, 6], rows(2)).hits == 1  # b's page survived
    c.free_sequence("a2")
    c.free_sequence("b2")
    c.free_sequence("x")
    c.add_sequence("y", [0, 0], rows(2))  # evicts the least recently released: a's head
    assert c.stats().evictions == 2
    assert c.add_sequence("b3", [5, 6], rows(2)).hits == 1
    assert c.add_sequence("a3", [1, 2], rows(2)).hits == 0


def test_out_of_pages_raises_and_leaves_everything_intact():
    c = PagedKVCache(3, 4, head_dim=D)
    c.add_sequence("a", list(range(6)), rows(6))
    before_pages, before_vals, before_stats = c.block_ids("a"), slot_values(c, "a"), c.stats()
    assert c.kv is not None
    before_kv = c.kv.clone()
    with pytest.raises(OutOfPagesError, match=r"sequence 'b'.*needs 3 new page\(s\).*only 1") as e:
        c.add_sequence("b", list(range(50, 62)), rows(12, 50))
    assert (e.value.seq_id, e.value.needed, e.value.available) == ("b", 3, 1)
    assert "b" not in c.sequences
    with pytest.raises(OutOfPagesError, match="sequence 'a'"):
        c.append("a", list(range(7)), rows(7, 6))  # 2 slots left in its page + 2 new pages > 1 free
    assert c.block_ids("a") == before_pages and slot_values(c, "a") == before_vals
    assert c.stats() == before_stats
    torch.testing.assert_close(c.kv, before_kv, equal_nan=True)
    c.append("a", [6, 7, 8], rows(3, 6))  # what still fits, fits
    assert c.seqlen("a") == 9


def test_cached_pages_count_as_available_but_hits_are_not_evicted_for_the_same_append():
    c = PagedKVCache(3, 2, head_dim=D)
    c.add_sequence("a", [1, 2, 3, 4], rows(4))
    c.free_sequence("a")
    # 1 free page + 2 cached; the prompt hits both cached pages and needs 1 fresh page.
    r = c.add_sequence("b", [1, 2, 3, 4, 5], rows(5))
    assert (r.hits, r.new_pages) == (2, 1) and c.stats().evictions == 0
    assert slot_values(c, "b") == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_fragmentation_and_bytes_exact():
    c = PagedKVCache(10, 4)  # bf16, 576 channels: 4 * 576 * 2 bytes per page
    c.add_sequence("a", list(range(10)), torch.randn(10, 576))
    c.add_sequence("b", list(range(4)) + [99], torch.randn(5, 576))
    s = c.stats()
    assert s.page_bytes == 4608
    assert (s.pages_in_use, s.allocated_slots, s.live_tokens) == (4, 16, 15)
    assert s.fragmentation == (12 - 10) + (4 - 1)  # a's tail page has 2 free slots, b's own page 3
    assert s.bytes_in_use == 4 * 4608 and s.bytes_resident == 4 * 4608
    assert s.bytes_per_token == pytest.approx(4 * 4608 / 15)
    c.free_sequence("a")
    s = c.stats()
    # a's two full pages stay cached (one still used by b), its partial page returns to the free list.
    assert (s.pages_in_use, s.pages_cached, s.pages_free, s.fragmentation) == (2, 1, 7, 3)
    assert s.bytes_resident == 3 * 4608 and s.bytes_per_token == pytest.approx(2 * 4608 / 5)
    f = PagedKVCache(2, 4, kv_dtype="fp8")
    assert f.stats().page_bytes == 4 * (576 + 4)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_reused_pages_are_poisoned_again(kv_dtype):
    c = PagedKVCache(2, 4, head_dim=D, kv_dtype=kv_dtype)
    c.add_sequence("a", list(range(8)), rows(8, 1))
    c.free_sequence("a")
    c.add_sequence("b", [50], rows(1, 1))  # evicts a cached page and reuses it
    page = c.block_ids("b")[0]
    assert c.kv is not None and c.stats().evictions == 1
    assert torch.isnan(c.kv[page, 1:].float()).all() and torch.isfinite(c.kv[page, 0].float()).all()
    if kv_dtype == "fp8":
        assert c.scales is not None and torch.isnan(c.scales[page, 1:]).all()


def test_out_of_pages_leaves_other_live_and_shared_sequences_intact():
    c = PagedKVCache(6, 4, head_dim=D)
    c.add_sequence("a", list(range(10)), rows(10))  # pages: [0..3] [4..7] [8, 9]
    c.add_sequence("b", list(range(8)) + [50], rows(9, 100))  # shares a's two full pages
    c.add_sequence("x", [7, 7, 7, 7], rows(4, 200))
    c.free_sequence("x")  # one cached (evictable) page
    before = {s: (c.block_ids(s), slot_values(c, s)) for s in ("a", "b")}
    refs = [c.ref_count(p) for p in range(6)]
    stats = c.stats()
    assert (stats.pages_in_use, stats.pages_cached, stats.pages_free) == (4, 1, 1)
    with pytest.raises(OutOfPagesError, match=r"sequence 'c'.*needs 3 new page\(s\).*only 2"):
        c.add_sequence("c", list(range(300, 312)), rows(12, 300))
    with pytest.raises(OutOfPagesError, match="sequence 'b'"):
        c.append("b", list(range(60, 72)), rows(12, 60))  # 3 slots left in its page, then 3 new pages
    assert {s: (c.block_ids(s), slot_values(c, s)) for s in ("a", "b")} == before
    assert [
        c.ref_count(p) for p in range(6)
    ] == refs and c.stats() == stats  # nothing evicted, no counter moved
    assert c.add_sequence("x2", [7, 7, 7, 7], rows(4, 200)).hits == 1  # the cached page survived both errors
