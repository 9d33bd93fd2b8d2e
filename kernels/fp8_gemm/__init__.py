"""DeepGEMM-style FP8 GEMM with fine-grained scaling: D[M,N] = A[M,K] x B[N,K]^T, bf16 out.

  quant       per-token 1x128 activation and 128x128 weight-block quantizers (fp8 e4m3, amax scaling),
              their dequantizers
  reference   the dequantized fp32 matmul and the unquantized bf16 matmul (what calc_diff is judged on)
  tiles       TileConfig, the DeepGEMM-like and Triton-port config spaces, DeepGEMM's choice rule
  resources   the static resource model per (config, shape): shared memory, waves, registers, pruning
  cost        FLOPs and bytes of one GEMM
  inputs      seeded input builder (bf16 originals plus their quantized forms)
  triton_gemm the Triton kernel and its launcher (imports triton)
  deep_gemm_adapter  the real DeepGEMM library when it is importable on a GPU host
  case        FAMILY: what the farm runs
This package file imports nothing, so the torch parts work without triton.
"""
