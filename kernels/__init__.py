"""Pure compute: the kernel families and what measures them. Nothing here imports the farm (jobs/,
cluster/); no family imports another; measure/ and common/ know no family (import-linter, pyproject.toml).

  base.py        the contract between families and the farm: TrialRequest, TrialOutcome, Cost, Backends
  registry.py    families by name, and FARM_PLUGINS (modules that register families or wrap backends)
  harness.py     the one measuring harness every trial goes through
  hardware.py    device limits (bandwidth, peak FLOPS) and the interpreter switch
  compiled.py    Triton kernels compiled for a GPU target on any host (registers, spills, shared memory)
  measure/       timing and stopping rule, correctness, memory, resources, sample statistics
  common/        what several families share: the lse convention, Triton attention steps, the paged MLA
                 cache, layout, reference and split-KV decode (common/mla/)
  gemm/ fp8_gemm/ paged_mla/ attention/ probe/   one folder per family: reference, inputs, cost,
                 Triton kernels, library adapters, case.py (FAMILY and its backends)
"""
