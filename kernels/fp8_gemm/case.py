"""The FP8 GEMM family the farm runs: D[M,N] = A[M,K] x B[N,K]^T, fp8 e4m3 in, bf16 out.

Backends:
  torch_ref   dequantize A and B with their scales, fp32 matmul (the baseline)
  torch_bf16  the unquantized bf16 matmul (the reference calc_diff is judged against; a speed anchor)
  triton      kernels.fp8_gemm.triton_gemm with the trial's tile config (block_m, block_n, block_k,
              group_m, num_warps, num_stages)
  deep_gemm   the DeepGEMM library, when importable on a GPU host (skipped, saying why, otherwise)
Every trial: correctness on policy.seeds seeds against the bf16 reference (kernels.fp8_gemm.check:
calc_diff below 1e-3 and every 128x128 output tile's max error, relative to the tile's largest reference
value, at most 0.15, so one wrong tile fails), then timing with kernels.measure. Metrics: time_ns,
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
from kernels.fp8_gemm.reference import gemm_bf16, gemm_dequant_fp32
from kernels.fp8_gemm.resources import estimate
from kernels.fp8_gemm.tiles import CONFIG_KEYS, TileConfig, deepgemm_choice
from kernels.harness import Checked, Prepared, run_trial
from kernels.measure.resources import collect_ncu, triton_resources

DTYPE = "float8_e4m3fn"

# A backend builds, for one set of inputs and the trial's tile config (triton only), a zero-argument
# callable writing D (after one call that compiles), plus the compiled Triton kernel when there is one.
Runner = Callable[[], torch.Tensor]
BACKENDS = Backends("fp8_gemm")


@BACKENDS.register("torch_ref", "dequantized fp32 torch matmul (baseline)")
def _torch_ref(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any]:
    return (lambda: gemm_dequant_fp32(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales)), None


@BACKENDS.register("torch_bf16", "unquantized bf16 torch matmul (the calc_diff reference)", reference=True)
def _torch_bf16(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any]:
    return (lambda: gemm_bf16(x.a, x.b)), None


def _out(x: GemmInputs) -> torch.Tensor:
    return torch.empty((x.a.shape[0], x.b.shape[0]), dtype=torch.bfloat16, device=x.a.device)


@BACKENDS.register(
    "triton",
    "Triton FP8 GEMM, 1x128 / 128x128 scales, tile config from the trial",
    config_keys=tuple(CONFIG_KEYS),
    requires=needs_triton,
)
def _triton(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any]:
    from kernels.fp8_gemm import triton_gemm  # imports triton: only for this backend

    assert cfg is not None
    out = _out(x)
    _, launch = triton_gemm.prepare(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg, out=out)
    compiled = launch()

    def call() -> torch.Tensor:
        launch()
        return out

    return call, compiled


@BACKENDS.register(
    "deep_gemm",
    "DeepGEMM library (GPU hosts with deep_gemm installed)",
    requires=deep_gemm_adapter.unavailable_reason,
)
def _deep_gemm(x: GemmInputs, cfg: TileConfig | None) -> tuple[Runner, Any]:
    out = _out(x)
    run = deep_gemm_adapter.make_call(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, out)

    def call() -> torch.Tensor:
        run()
        return out

    return call, None


# What is known of a library backend's kernel without running it (its resources' "model"), by backend:
# DeepGEMM's own tile choice for the shape.
RESOURCE_MODELS: dict[str, Callable[[int, int, int], dict[str, Any]]] = {
    "deep_gemm": lambda m, n, k: {"deepgemm_choice": deepgemm_choice(m, n, k).to_dict()},
}


class Fp8GemmFamily(KernelFamily):
    name = "fp8_gemm"
    backends = BACKENDS
    shape_keys = ("m", "n", "k")
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
        if set(shape) != set(self.shape_keys):
            raise ValueError(f"shape needs exactly the keys m, n, k (got {sorted(shape)})")
        for key in self.shape_keys:
            if not isinstance(shape[key], int) or isinstance(shape[key], bool) or shape[key] < 1:
                raise ValueError(f"shape.{key} must be a positive integer (got {shape[key]!r})")
        if dtype != DTYPE:
            raise ValueError(f"fp8_gemm operands are {DTYPE} (got dtype {dtype})")
        if self.backends[backend].config_keys:
            TileConfig.from_dict(config)
        elif config:
            raise ValueError(f"backend {backend} takes no config (got {config})")

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        return gemm_cost(shape["m"], shape["n"], shape["k"])

    def meta_launch(
        self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str
    ) -> Callable[[], Any] | None:
        if not self.backends[backend].runs_triton:
            return None
        from kernels.fp8_gemm import triton_gemm

        return triton_gemm.meta_launch(shape["m"], shape["n"], shape["k"], TileConfig.from_dict(config))

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
        cost = self.cost(req.shape, req.dtype)
        base_metrics = {"flops": cost.flops, "bytes": cost.bytes}  # of a trial that does not run
        resources: dict[str, Any] = {}
        cfg: TileConfig | None = None
        if self.backends[req.backend].config_keys:  # a tiled kernel: the static model may prune it
            cfg = TileConfig.from_dict(req.config)
            est = estimate(cfg, m, n, k)
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
            x = build_inputs(m, n, k, seed, device)
            call, compiled = build(x, cfg)
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

            return Prepared(call, check, cost, resources=compiled_resources)

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
