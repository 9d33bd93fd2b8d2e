"""The paged MLA family: FlashMLA-style decode over a paged KV cache, and the cache manager's trace benchmark.

  (the paged cache, the layouts, the torch reference, the Triton kernels, the cost model and the
  correctness rule are kernels.common.mla, which attention's decode_step shares)
  inputs         sample_seqlens, build_decode_inputs (seeded; NaN-poisoned unused slots)
  trace          synthetic_trace, replay_trace: a multi-turn serving trace through the cache manager
  trace_bench    the cache_trace benchmark: a trace sized from a shape, counters and a time series
  flash_mla_adapter  the FlashMLA library behind the same call (GPU host with flash_mla installed)
  case           FAMILY: what the farm runs (torch_ref, triton, flash_mla, cache_trace backends)
This package file imports nothing; case imports kernels.common.mla.triton_decode only for the triton
backend.
"""
