"""The FP8 GEMM family the farm runs: D[M,N] = A[M,K] x B[N,K]^T, fp8 e4m3 in, bf16 out.

Shape: m, n, k, and optionally scale_group, the scales' granularity g (1 x g per-token scales of A,
g x g block scales of B): 128 (DeepGEMM's; what a shape without the key means) or 64. A spec may write
scale_group: 128, but the point is stored without it (`canonical_shape`), so it is one series with the
same GEMM written without the key. The group reaches the quantization of every seed's inputs, both
torch references, the kernel, the compile check (meta_launch), the cost (scale bytes) and the resource
model, which prunes a triton config whose block_k does not divide the group ("pruned: block_k 128 does
not divide the scale group 64 ..."), so one spec can sweep both groups over one config grid.

Backends:
  torch_ref   dequantize A and B with their scales, fp32 matmul (the baseline)
  torch_bf16  the unquantized bf16 matmul (the reference calc_diff is judged against; a speed anchor)
  triton      kernels.fp8_gemm.triton_gemm with the trial's tile config (block_m, block_n, block_k,
              group_m, num_warps, num_stages)
  deep_gemm   the DeepGEMM library, when importable on a GPU host (skipped, saying why, otherwise; at
              scale_group 64 always skipped: its SM90 path takes 128-granular scales only)
Every trial: correctness on policy.seeds seeds against the bf16 reference (kernels.fp8_gemm.check:
calc_diff below 1e-3 and every 128x128 output tile's max error, relative to the tile's largest reference
value, at most 0.15, so one wrong tile fails), then timing with kernels.measure, then the timed call once
more with the tensors it reads (each backend says which: `Reads`) refilled in place from a fresh seed
(kernels.harness.stale_output: a cached result is `invalid`). Metrics: time_ns,
TFLOPS, GB/s, calc_diff, tile_err (the worst tile's error), spread (cv, and IQR over the median).
Resources of a triton trial: the static model (`model`, kernels.fp8_gemm.resources) and the compiled
kernel's registers / spills / shared memory (`compiled`, on a GPU), and Nsight Compute metrics
(bank conflicts, `ncu`) when the policy asks. A config the model prunes is not run: the trial is
`pruned`, its error text starts "pruned: " with the reasons, and the model numbers are stored with it.
Where Triton compiles (not the interpreter), a config the model passes is then compiled for the host's
target (sm_90a without a GPU) as the JIT would launch it (kernels.compiled); one that spills or needs
more shared memory than a block gets is `pruned` with the compiler's numbers (`compiled_check`).
`deep_gemm` on a host without the library is `skipped`, with the reason.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

from kernels.base import (
    Backends,
    Cost,
    KernelFamily,
    Metric,
    TrialOutcome,
    TrialRequest,
    TrialStatus,
    needs_triton,
)
from kernels.compiled import trial_check
from kernels.fp8_gemm import deep_gemm_adapter
from kernels.fp8_gemm.check import CALC_DIFF_THRESHOLD, check_fp8_gemm, worst_tile_error
from kernels.fp8_gemm.cost import gemm_cost
from kernels.fp8_gemm.inputs import GemmInputs, build_inputs
from kernels.fp8_gemm.quant import GROUP, SCALE_GROUPS, check_scale_group
from kernels.fp8_gemm.reference import gemm_bf16, gemm_dequant_fp32
from kernels.fp8_gemm.resources import deepgemm_choice, estimate
from kernels.fp8_gemm.tiles import CONFIG_KEYS, TileConfig
from kernels.harness import Checked, Prepared, run_trial
from kernels.measure.resources import collect_ncu, triton_resources

DTYPE = "float8_e4m3fn"

# A backend builds, for one set of inputs and the trial's tile config (triton only), a zero-argument
# callable writing D (after one call that compiles), the compiled Triton kernel when there is one, and the
# tensors the callable reads (`Reads`): after timing the harness refills them in place from a fresh seed's
# (kernels.harness.stale_output), so they are the tensors the call holds, including any it laid out from
# the inputs when it was built (DeepGEMM's A scales), and all of them differ between seeds.
Runner = Callable[[], torch.Tensor]
Reads = tuple[torch.Tensor, ...]
BACKENDS = Backends("fp8_gemm")


def _quantized(x: GemmInputs) -> Reads:
    """The quantized operands and their scales, as the inputs hold them."""
    return x.a_fp8, x.a_scales, x.b_fp8, x.b_scales


@BACKENDS.register("torch_ref", "dequantized fp32 torch matmul (baseline)")
def _torch_ref(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any, Reads]:
    g = x.scale_group
    return (lambda: gemm_dequant_fp32(*_quantized(x), group=g)), None, _quantized(x)


@BACKENDS.register("torch_bf16", "unquantized bf16 torch matmul (the calc_diff reference)", reference=True)
def _torch_bf16(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any, Reads]:
    return (lambda: gemm_bf16(x.a, x.b)), None, (x.a, x.b)


def _out(x: GemmInputs) -> torch.Tensor:
    return torch.empty((x.a.shape[0], x.b.shape[0]), dtype=torch.bfloat16, device=x.a.device)


@BACKENDS.register(
    "triton",
    "Triton FP8 GEMM, 1xg / gxg scales (g = the shape's scale_group), tile config from the trial",
    config_keys=tuple(CONFIG_KEYS),
    requires=needs_triton,
)
def _triton(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any, Reads]:
    from kernels.fp8_gemm import triton_gemm  # imports triton: only for this backend

    assert cfg is not None
    out = _out(x)
    _, launch = triton_gemm.prepare(
        x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg, out=out, scale_group=x.scale_group
    )
    compiled = launch()

    def call() -> torch.Tensor:
        launch()
        return out

    return call, compiled, _quantized(x)  # the launch holds these tensors themselves, no copy


@BACKENDS.register(
    "deep_gemm",
    "DeepGEMM library (GPU hosts with deep_gemm installed)",
    requires=deep_gemm_adapter.unavailable_reason,
    skips=lambda shape: deep_gemm_adapter.scale_group_reason(scale_group_of(shape)),
)
def _deep_gemm(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any, Reads]:
    out = _out(x)
    # A's scales laid out here, once (make_call passes a laid-out copy through as it is): the call reads
    # this copy, not x.a_scales, so it is this copy that is refilled after timing
    sfa = deep_gemm_adapter.tma_aligned_scales(x.a_scales)
    run = deep_gemm_adapter.make_call(x.a_fp8, sfa, x.b_fp8, x.b_scales, out)

    def call() -> torch.Tensor:
        run()
        return out

    return call, None, (x.a_fp8, sfa, x.b_fp8, x.b_scales)


# What is known of a library backend's kernel without running it (its resources' "model"), by backend:
# DeepGEMM's own tile choice for the shape.
RESOURCE_MODELS: dict[str, Callable[[int, int, int], dict[str, Any]]] = {
    "deep_gemm": lambda m, n, k: {"deepgemm_choice": deepgemm_choice(m, n, k).to_dict()},
}


def scale_group_of(shape: dict[str, Any]) -> int:
    """The shape's scale group (128 where the shape does not name one)."""
    return shape.get("scale_group", GROUP)


class Fp8GemmFamily(KernelFamily):
    name = "fp8_gemm"
    backends = BACKENDS
    shape_keys = ("m", "n", "k")
    optional_shape_keys = ("scale_group",)
    report_metrics = (Metric("calc_diff", "calc_diff", ".1e"), Metric("spread_cv", "cv", ".3f"))
    scaling = (("m", "tflops"),)

    def best_configs(self, trials: Any, backend: str) -> tuple[dict[str, Any], list[str]]:
        """Triton ports' tuned-config JSON (kernels.fp8_gemm.export)."""
        from kernels.fp8_gemm.export import best_configs

        return best_configs(trials, backend)

    def best_configs_file(self, key: str, device_name: str) -> str:
        from kernels.fp8_gemm.export import port_file_name

        return port_file_name(key, device_name)

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        missing = [key for key in self.shape_keys if key not in shape]
        if missing:
            raise ValueError(f"shape needs the keys m, n, k (got {sorted(shape)})")
        unknown = sorted(set(shape) - set(self.shape_keys) - set(self.optional_shape_keys))
        if unknown:
            raise ValueError(f"unknown shape keys {unknown} (known: m, n, k and optionally scale_group)")
        for key in self.shape_keys:
            if not isinstance(shape[key], int) or isinstance(shape[key], bool) or shape[key] < 1:
                raise ValueError(f"shape.{key} must be a positive integer (got {shape[key]!r})")
        if "scale_group" in shape:
            try:
                check_scale_group(shape["scale_group"])
            except ValueError:
                allowed = ", ".join(map(str, SCALE_GROUPS))
                raise ValueError(
                    f"shape.scale_group must be one of {allowed} (got {shape['scale_group']!r}); "
                    f"without the key it is {GROUP}"
                ) from None
        if dtype != DTYPE:
            raise ValueError(f"fp8_gemm operands are {DTYPE} (got dtype {dtype})")
        if self.backends[backend].config_keys:
            TileConfig.from_dict(config)
        elif config:
            raise ValueError(f"backend {backend} takes no config (got {config})")

    def canonical_shape(self, shape: dict[str, Any]) -> dict[str, Any]:
        """The shape as stored: scale_group 128, the default, left out (one series with or without it)."""
        if shape.get("scale_group") == GROUP and not isinstance(shape["scale_group"], bool):
            return {key: value for key, value in shape.items() if key != "scale_group"}
        return shape

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        return gemm_cost(shape["m"], shape["n"], shape["k"], scale_group_of(shape))

    def meta_launch(
        self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str
    ) -> Callable[[], Any] | None:
        if not self.backends[backend].runs_triton:
            return None
        from kernels.fp8_gemm import triton_gemm

        cfg = TileConfig.from_dict(config)
        return triton_gemm.meta_launch(shape["m"], shape["n"], shape["k"], cfg, scale_group_of(shape))

    def unavailable(self, req: TrialRequest, reason: str) -> TrialOutcome:
        """Skipped, with what is known without running: the cost, and DeepGEMM's own tile choice."""
        m, n, k = req.shape["m"], req.shape["n"], req.shape["k"]
        cost = self.cost(req.shape, req.dtype)
        model = RESOURCE_MODELS.get(req.backend)
        return TrialOutcome(
            status=TrialStatus.SKIPPED,
            error=reason,
            resources={"model": model(m, n, k)} if model else {},
            metrics={"flops": cost.flops, "bytes": cost.bytes},
        )

    def execute(self, req: TrialRequest) -> TrialOutcome:
        self.validate(req.shape, req.config, req.dtype, req.backend)
        m, n, k = req.shape["m"], req.shape["n"], req.shape["k"]
        group = scale_group_of(req.shape)
        cost = self.cost(req.shape, req.dtype)
        base_metrics = {"flops": cost.flops, "bytes": cost.bytes}  # of a trial that does not run
        resources: dict[str, Any] = {}
        cfg: TileConfig | None = None
        if self.backends[req.backend].config_keys:  # a tiled kernel: the static model may prune it
            cfg = TileConfig.from_dict(req.config)
            est = estimate(cfg, m, n, k, scale_group=group)
            resources["model"] = est.to_dict()
            if est.pruned:
                return TrialOutcome(
                    status=TrialStatus.PRUNED,
                    error=est.prune_message(),
                    resources=resources,
                    metrics=base_metrics,
                )
            check = trial_check(self, req.shape, req.config, req.dtype, req.backend)
            if check is not None:
                resources["compiled_check"] = check
                if check.get("problems"):
                    return TrialOutcome(
                        status=TrialStatus.PRUNED,
                        error="pruned: " + "; ".join(check["problems"]),
                        resources=resources,
                        metrics=base_metrics,
                    )
        elif req.backend in RESOURCE_MODELS:
            resources["model"] = RESOURCE_MODELS[req.backend](m, n, k)

        build = self.backends.impl(req.backend)

        def prepare(seed: int, device: torch.device) -> Prepared:
            x = build_inputs(m, n, k, seed, device, scale_group=group)
            call, compiled, reads = build(x, cfg)
            ref = gemm_bf16(x.a, x.b)

            def check(out: torch.Tensor) -> Checked:
                report = check_fp8_gemm(out, ref, threshold=CALC_DIFF_THRESHOLD)
                return Checked(
                    report, worst={"calc_diff": report.calc_diff, "tile_err": worst_tile_error(out, ref)}
                )

            def compiled_resources() -> dict[str, Any]:
                if cfg is None:
                    return {}
                return {"compiled": triton_resources(compiled), "ncu": _ncu(req, cfg)}

            # what the call reads, refilled in place from a fresh seed after timing: every one of them
            # follows the seed, and the shapes follow the shape alone
            return Prepared(call, check, cost, resources=compiled_resources, inputs=reads)

        return run_trial(req, prepare, precision="fp8", resources=resources)


def _ncu(req: TrialRequest, cfg: TileConfig) -> dict[str, Any]:
    """Nsight Compute metrics (bank conflicts, occupancy, L2 hit rate) of the kernel on this shape, when
    the policy asks and a GPU and ncu are there."""
    if req.policy.ncu and not req.device.startswith("cuda"):
        return {"collected": False, "reason": "Nsight Compute needs a GPU"}
    argv = [
        sys.executable,
        "-m",
        "kernels.fp8_gemm.profile_target",
        json.dumps(req.shape),
        json.dumps(cfg.to_dict()),
    ]
    return collect_ncu(argv, enabled=req.policy.ncu, kernel_name="fp8_gemm_kernel", launch_skip=1)


FAMILY = Fp8GemmFamily()
