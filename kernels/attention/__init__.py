"""The model's main attention, for regression: dense causal prefill, GQA decode, the MLA latent decode
form, top-k sparse attention (DeepSeek sparse attention), and a paged decode step.

  reference      torch references (run anywhere; fp64 for correctness): attention_reference,
                 sparse_attention_reference, mla_decode_reference, the causal rule, sparse-index semantics
                 (FlashMLA's: softmax over index slots, a repeated position counted once per slot)
  inputs         seeded input builders (NaN-poisoned memory a kernel must not read)
  cost           FLOPs and bytes per mode
  triton_common  shared Triton helpers (head-dim split, tile loads, online softmax, split-KV merge and
                 split count; kernels.common.mla.triton_decode uses them too)
  triton_prefill flash-attention forward (online softmax, causal, GQA)
  triton_decode  split-KV decode with GQA heads packed into the rows, plus the combine kernel
  triton_sparse  top-k sparse attention gathering KV rows by index slot (no de-duplication)
  decode_step    one paged MLA decode step: KV append into kernels.common.mla's cache + attention
  shapes         the spec's shape keys, per-mode defaults and validation
  case           the farm's FAMILY
  profile        the program ncu profiles for a trial (GPU only)
  sdpa           the dense baseline: torch scaled_dot_product_attention on these layouts
Compiled evidence (registers, spills, shared memory, wgmma, as the JIT builds each trial's kernels for
sm_90a, on any machine): kernels.compiled through `case.FAMILY.meta_launch`.
Layouts: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v], out [b, s_q, h_q, d_v],
lse [b, h_q, s_q] fp32, natural log; a row that sees no key has out 0 and lse +inf in every reference,
kernel and backend (kernels.common.lse, FlashMLA's convention). This file imports nothing, so the
references work without triton.
"""
