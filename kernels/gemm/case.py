"""A plain GEMM family: C[M,N] = A[M,K] @ B[K,N] with two torch backends.

It exercises the farm end to end with a real kernel before the FP8 GEMM family exists:
  torch_fp32  fp32 matmul (the baseline and the reference)
  torch_bf16  bf16 matmul of the same inputs, checked against the fp32 result
FLOPs = 2*M*N*K; bytes = (M*K + K*N + M*N) * element size of the compute dtype.
Config: none. A backend's implementation is a `Matmul`, which builds the call to time from the inputs; a
FARM_PLUGINS module may wrap it (kernels.base.Backends.wrap), as the test suite's faults do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kernels.base import Backends, Cost, KernelFamily, TrialOutcome, TrialRequest
from kernels.hardware import precision_of
from kernels.harness import Checked, Prepared, run_trial
from kernels.measure.correctness import check_allclose


@dataclass(frozen=True)
class Matmul:
    """A backend's matmul of inputs already in `dtype` (the family casts them outside the timed call)."""

    dtype: torch.dtype

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, config: dict[str, Any]
    ) -> Callable[[], torch.Tensor]:
        return lambda: a @ b


BACKENDS = Backends("gemm")
BACKENDS.add("torch_fp32", "torch.matmul in float32 (reference)", reference=True, impl=Matmul(torch.float32))
BACKENDS.add("torch_bf16", "torch.matmul in bfloat16", impl=Matmul(torch.bfloat16))


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
        declared = self.backends[backend]
        unknown = sorted(set(config) - set(declared.config_keys))
        if unknown:
            takes = f"takes only {list(declared.config_keys)}" if declared.config_keys else "takes no config"
            raise ValueError(f"gemm backend {backend} {takes} (got {unknown})")
        if declared.check is not None:
            declared.check(shape, config)
        if dtype != "float32":
            raise ValueError(f"gemm inputs are float32; the backend picks the compute dtype (got {dtype})")

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        m, n, k = shape["m"], shape["n"], shape["k"]
        elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        return Cost(
            flops=2.0 * m * n * k, bytes_read=float((m * k + k * n) * elem), bytes_written=float(m * n * elem)
        )

    def execute(self, req: TrialRequest) -> TrialOutcome:
        matmul = self.backends.impl(req.backend)
        compute = matmul.dtype
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
            a, b = a.to(compute), b.to(compute)  # what the call reads, refilled in place after timing
            return Prepared(
                call=matmul(a, b, req.config),
                inputs=(a, b),
                check=lambda out: Checked(check_allclose(out, reference, atol=atol)),
                cost=cost,
                figures=lambda: {"compute_dtype": compute_dtype},
            )

        return run_trial(req, prepare, precision=precision_of(compute_dtype))


FAMILY = GemmFamily()
