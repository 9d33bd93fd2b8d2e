"""FlashMLA-style paged MLA decode, shared by the paged_mla family and attention's decode_step mode.

  layout         shapes, constants (INVALID_BLOCK_ID, PAGE_SIZES, MAX_PAGE_SIZE, EMPTY_ROW_LSE), fp8 helpers:
                 per-token scales, FlashMLA's 656-byte tokens (power-of-two scales, bf16 dequantisation)
  cache          PagedKVCache (pages, block tables, prefix hits, LRU eviction, counters), OutOfPagesError
  reference      mla_decode_reference: fp32 torch decode over the paged layout (runs anywhere)
  split_plan     the split-KV work plans (uniform, FlashMLA-style balanced), built on the host
  decode_kernels the Triton split and combine kernels, and their default tiles per compile target
  triton_decode  mla_decode_triton (split-KV + combine), choose_num_splits (imports triton)
  cost           mla_decode_cost: FLOPs and bytes (FlashMLA's accounting)
  check          check_decode: the FlashMLA correctness rule on out and lse
This package file imports nothing, so the torch reference works without triton installed. Without a GPU,
decode_kernels sets TRITON_INTERPRET=1 when it is unset (before triton's first import in the process).
"""
