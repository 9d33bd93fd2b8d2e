"""Kernel test support: the recording CUDA fake and the fault injection the tests register.

fake_cuda   FakeCuda: a recording fake of kernels.measure.cuda_layer (each timing method's call order)
broken      kernels broken on purpose, built on the product's: an off-by-one causal mask (attention
            prefill), a paged MLA decode that reads past every sequence's end
faults      the FARM_PLUGINS module (kernels.registry) that wraps product backends with injected faults
            (gemm `_repeat` / `_perturb`, probe `_slowdown`, paged_mla `_overread`), declared as variant
            keys so a faulty trial is the same point as its baseline; `enable()` names it in FARM_PLUGINS
            for this process, its Ray workers and its subprocesses
stale       a product family's trials watched: whether the harness's recheck after timing ran, and a
            call made to return its first output forever (kernels.harness.stale_output)
"""
