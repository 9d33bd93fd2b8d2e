from kernels.paged_mla.trace import TraceEvent, replay_trace, synthetic_trace


def test_synthetic_trace_shape():
    ev = synthetic_trace(conversations=4, turns=2, concurrency=2, seed=1)
    starts = [e for e in ev if e.kind == "start"]
    assert len(starts) == 8 and sum(e.kind == "finish" for e in ev) == 8
    assert ev == synthetic_trace(conversations=4, turns=2, concurrency=2, seed=1)
    # The second turn's prompt extends the first turn's prompt and reply.
    t0 = next(e for e in starts if e.request == "c0t0").tokens
    t1 = next(e for e in starts if e.request == "c0t1").tokens
    assert t1[: len(t0)] == t0 and len(t1) > len(t0)


def test_replay_counts_hits_and_survives_a_small_pool():
    ev = synthetic_trace(conversations=6, turns=3, system_prompts=1, system_len=128, seed=2)
    big = replay_trace(ev, page_size=32, num_pages=1024)
    assert big.final.hit_rate > 0.5 and big.final.evictions == 0 and big.rejected == big.preempted == 0
    assert big.final.live_sequences == 0 and big.final.pages_in_use == 0
    small = replay_trace(ev, page_size=32, num_pages=24)
    assert small.final.evictions > 0 and small.final.pages_in_use == 0
    assert small.peak_bytes_resident <= 24 * small.final.page_bytes


def test_replay_rejects_what_cannot_fit():
    ev = [TraceEvent("start", "a", tuple(range(40))), TraceEvent("start", "b", tuple(range(100, 200)))]
    r = replay_trace(ev, page_size=16, num_pages=4)
    assert r.rejected == 1 and r.final.live_sequences == 1 and r.final.live_tokens == 40
