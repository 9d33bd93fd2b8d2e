"""FlashMLA-style paged MLA decode: the KV cache manager, the torch reference, the Triton kernels.

  layout         shapes, constants (INVALID_BLOCK_ID, PAGE_SIZES, MAX_PAGE_SIZE, EMPTY_ROW_LSE), fp8 helpers:
                 per-token scales, FlashMLA's 656-byte tokens (power-of-two scales, bf16 dequantisation)
  cache          PagedKVCache (pages, block tables, prefix hits, LRU eviction, counters), OutOfPagesError
  reference      mla_decode_reference: fp32 torch decode over the paged layout (runs anywhere)
  triton_decode  mla_decode_triton (split-KV + combine), choose_num_splits (imports triton)
  cost           mla_decode_cost: FLOPs and bytes (FlashMLA's accounting)
  inputs         sample_seqlens, build_decode_inputs (seeded; NaN-poisoned unused slots)
  check          check_decode: the FlashMLA correctness rule on out and lse
  trace          synthetic_trace, replay_trace: a multi-turn serving trace through the cache manager
  trace_bench    the cache_trace benchmark: a trace sized from a shape, counters and a time series
  flash_mla_adapter  the FlashMLA library behind the same call (GPU host with flash_mla installed)
  case           FAMILY: what the farm runs (torch_ref, triton, flash_mla, cache_trace backends)
This package file imports nothing, so the torch reference works without triton installed; case imports
triton_decode only for the triton backend. Without a GPU, triton_decode sets TRITON_INTERPRET=1 when it is
unset (before triton's first import in the process).
"""
