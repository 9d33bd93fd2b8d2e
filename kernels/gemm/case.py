"""A plain GEMM family: C[M,N] = A[M,K] @ B[K,N] with two torch backends.

It exercises the farm end to end with a real kernel before the FP8 GEMM family exists:
  torch_fp32  fp32 matmul (the baseline and the reference)
  torch_bf16  bf16 matmul of the same inputs, checked against the fp32 result
FLOPs = 2*M*N*K; bytes = (M*K + K*N + M*N) * element size of the compute dtype.

Config: none in normal use. Two test knobs inject faults the farm's acceptance must catch; like every
`_` config key they change the code that runs, not the point measured (baselines and anomaly
fingerprints ignore them, see jobs.judge.baselines):
  _repeat: N     the backend computes the matmul N times per call (N >= 1; the timed call and the
                 checked call alike): a real slowdown of about N x, with a correct result
  _perturb: x    the backend adds x to the first element of its output: a wrong result (x != 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernels.base import Backends, Cost, KernelFamily, TrialOutcome, TrialRequest
from kernels.hardware import precision_of
from kernels.harness import Checked, Prepared, run_trial
from kernels.measure.correctness import check_allclose

_KNOBS = ("_repeat", "_perturb")

# A backend is its compute dtype: the inputs are cast to it and multiplied with torch.matmul.
BACKENDS = Backends("gemm")
BACKENDS.add("torch_fp32", "torch.matmul in float32 (reference)", reference=True, config_keys=_KNOBS,
             impl=lambda: torch.float32)  # fmt: skip
BACKENDS.add("torch_bf16", "torch.matmul in bfloat16", config_keys=_KNOBS, impl=lambda: torch.bfloat16)


def _backend_call(a: torch.Tensor, b: torch.Tensor, config: dict[str, Any]) -> Callable[[], torch.Tensor]:
    """The backend's matmul of a and b (already in the compute dtype), with the config's test knobs."""
    repeat = int(config.get("_repeat", 1))
    perturb = float(config.get("_perturb", 0.0))

    def call() -> torch.Tensor:
        out = a @ b
        for _ in range(repeat - 1):
            out = a @ b
        if perturb:
            out.view(-1)[0] += perturb
        return out

    return call


class GemmFamily(KernelFamily):
    name = "gemm"
    backends = BACKENDS
    shape_keys = ("m", "n", "k")

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        if set(shape) != set(self.shape_keys):
            raise ValueError(f"shape needs exactly the keys m, n, k (got {sorted(shape)})")
        for key in self.shape_keys:
            if not isinstance(shape[key], int) or isinstance(shape[key], bool) or shape[key] < 1:
                raise ValueError(f"shape.{key} must be a positive integer (got {shape[key]!r})")
        unknown = sorted(set(config) - set(self.backends[backend].config_keys))
        if unknown:
            raise ValueError(f"gemm backends take only the test knobs {list(_KNOBS)} (got {unknown})")
        repeat = config.get("_repeat", 1)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"config._repeat must be an integer >= 1 (got {repeat!r})")
        perturb = config.get("_perturb", 0.0)
        if not isinstance(perturb, int | float) or isinstance(perturb, bool):
            raise ValueError(f"config._perturb must be a number (got {perturb!r})")
        if dtype != "float32":
            raise ValueError(f"gemm inputs are float32; the backend picks the compute dtype (got {dtype})")

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        m, n, k = shape["m"], shape["n"], shape["k"]
        elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        return Cost(
            flops=2.0 * m * n * k, bytes_read=float((m * k + k * n) * elem), bytes_written=float(m * n * elem)
        )

    def execute(self, req: TrialRequest) -> TrialOutcome:
        compute = self.backends.impl(req.backend)()
        compute_dtype = str(compute).removeprefix("torch.")  # what ran: the spec's dtype is the inputs'
        m, n, k = req.shape["m"], req.shape["n"], req.shape["k"]
        cost = self.cost(req.shape, compute_dtype)
        # Input rounding errors add up as a random walk over K: the absolute tolerance grows as sqrt(K).
        atol = None if compute == torch.float32 else 2e-2 * k**0.5

        def prepare(seed: int, device: torch.device) -> Prepared:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            a = torch.randn(m, k, generator=gen).to(device)
            b = torch.randn(k, n, generator=gen).to(device)
            reference = a @ b
            return Prepared(
                call=_backend_call(a.to(compute), b.to(compute), req.config),
                check=lambda out: Checked(check_allclose(out, reference, atol=atol)),
                cost=cost,
                figures=lambda: {"compute_dtype": compute_dtype},
            )

        return run_trial(req, prepare, precision=precision_of(compute_dtype))


FAMILY = GemmFamily()
