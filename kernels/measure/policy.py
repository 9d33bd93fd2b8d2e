"""The measurement policy: every knob of how a trial is timed. A spec's `measure:` section is this model.

Defaults follow the reference anchors (../shared/REFERENCE.md, "Timing methodology"): at least 10 samples,
stop when the relative standard deviation is below 0.5% after 0.5 s of measured time or when the noise
stops improving, a 15 s wall-clock cap, L2 flushed before every sample, samples taken while the SM clock
fell more than 5% below the clock the run started with flagged, correctness on at least two seeds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MeasurePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- sampling and stopping -------------------------------------------------------------------------
    warmup_ms: float = Field(25.0, ge=0, description="warm-up by time before the first sample")
    min_samples: int = Field(10, ge=1, description="never stop before this many samples")
    # High enough that a 25 us kernel still reaches min_time_s (nvbench has no sample cap, only a time
    # cap): with 1000, every kernel under 0.5 ms stopped on max_samples and never converged.
    max_samples: int = Field(20_000, ge=1, description="stop after this many samples")
    max_time_s: float = Field(15.0, gt=0, description="wall-clock cap on measuring one callable")
    target_rel_stdev: float = Field(
        0.005, gt=0, lt=1, description="stop ('converged') once stdev/mean of the samples is below this"
    )
    min_time_s: float = Field(
        0.5, ge=0, description="measured time (sum of kept samples) required before a converged/noise stop"
    )
    noise_stop: bool = Field(True, description="stop ('noise_plateau') when the noise stops improving")
    noise_window: int = Field(
        64, ge=4, le=100_000, description="how many recent noise values the noise-stop rule looks at"
    )
    noise_min_improvement: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="noise counts as improving if it fell by at least this fraction over the window",
    )
    max_cv: float = Field(
        0.02, gt=0, lt=1, description="dispersion limit: above it a measurement is flagged noisy"
    )

    # -- GPU timer -------------------------------------------------------------------------------------
    flush_l2: bool = Field(True, description="flush the L2 cache (write >= 2x its size) before every sample")
    cuda_graph: bool = Field(
        False, description="always time a CUDA-graph replay (by default, kernels under ~100 us are replayed)"
    )
    kernel_only: bool = Field(False, description="kernel time from the torch profiler (CUPTI)")
    kernel_name: str | None = Field(
        None, min_length=1, description="substring of the kernel names that kernel-only timing sums"
    )
    gpu_batch: int = Field(
        10, ge=1, le=1000, description="samples enqueued before one synchronisation (GPU timers)"
    )

    # -- clocks ----------------------------------------------------------------------------------------
    throttle_max_drop: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="a sample is throttled when the SM clock fell more than this fraction below the SM clock "
        "the run started with",
    )
    discard_throttled: bool = Field(
        True, description="leave throttled samples out of the summary and the stopping rule (kept raw)"
    )

    # -- correctness and resources ---------------------------------------------------------------------
    seeds: int = Field(2, ge=1, le=1000, description="correctness must hold on this many seeds")
    poison_unused: bool = Field(True, description="fill memory a kernel must not read with NaN")
    ncu: bool = Field(False, description="collect Nsight Compute metrics when `ncu` is on PATH")

    @model_validator(mode="after")
    def _consistent(self) -> MeasurePolicy:
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below min_samples ({self.min_samples})")
        if self.cuda_graph and self.kernel_only:
            raise ValueError("cuda_graph and kernel_only are two different timers: choose one")
        if self.kernel_name is not None and not self.kernel_only:
            raise ValueError("kernel_name filters kernel-only timing: set kernel_only: true or drop it")
        return self

    def timer_name(self, on_gpu: bool) -> str:
        """The label of the timer this policy selects on a GPU or a CPU."""
        if not on_gpu:
            return "cpu_perf_counter"
        if self.kernel_only:
            return "cupti"
        if self.cuda_graph:
            return "cuda_graph"
        return "cuda_event"
