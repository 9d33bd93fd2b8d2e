"""An adversarial kernel family, registered by the tests only (through FARM_PLUGINS, kernels.registry):
backends written to look fast, each of which the harness must store `invalid` with its reason
(kernels.validity, kernels.harness), beside an honest one that must stay `ok`.

  family `adversarial`, shape m, n, k, dtype float32: out = a @ b
    honest   torch's matmul, every call (the reference)
    cached   the product computed once when the call is built; every call returns it (the work is done
             before the timed region): faster than the host allows, and stale once the inputs change
    replay   the first call's result recorded, a copy of it returned by every later call: right for the
             seed it was recorded on, stale for any other
    threaded the product computed by a helper thread the call waits on: right, honest wall time, but the
             work is not the timed thread's (with torch on one thread, it is work handed off)
    lazy     the whole product for its first two calls (the seeds' checks), then only the first quarter of
             the rows (the rest left from before): less work than the trial declares, seen once the
             inputs change after timing
  GPU only (skipped with the reason on a CPU; tests/kernels/test_validity_gpu.py):
    side_stream    the product launched on a second stream the timing stream never waits for: its
                   events time the launch; the work outlives the end event (kernels.measure.outside)
    persisting_l2  every call sets L2 aside for persisting accesses and an access-policy window over its
                   inputs on the stream, so they would stay in L2 across the flush

testkit.kernels.faults, the plugin the tests name in FARM_PLUGINS (tests/conftest.py), registers it, so
Ray workers and subprocesses know the family too; this module (and torch) loads only where it is asked for.
"""

from __future__ import annotations

import concurrent.futures
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kernels.base import Backends, Cost, KernelFamily, TrialOutcome, TrialRequest
from kernels.harness import Checked, Prepared, run_trial
from kernels.measure.correctness import check_allclose

Call = Callable[[], torch.Tensor]


def _honest(a: torch.Tensor, b: torch.Tensor) -> Call:
    return lambda: a @ b


def _cached(a: torch.Tensor, b: torch.Tensor) -> Call:
    out = a @ b
    return lambda: out


def _replay(a: torch.Tensor, b: torch.Tensor) -> Call:
    recorded: list[torch.Tensor] = []

    def call() -> torch.Tensor:
        if not recorded:
            recorded.append(a @ b)
        return recorded[0].clone()

    return call


def _threaded(a: torch.Tensor, b: torch.Tensor) -> Call:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="adversarial")
    weakref.finalize(a, pool.shutdown, wait=False)  # the pool goes with the trial's inputs
    return lambda: pool.submit(torch.matmul, a, b).result()


def _lazy(a: torch.Tensor, b: torch.Tensor) -> Call:
    out = torch.empty(a.shape[0], b.shape[1])
    calls = [0]
    rows = max(1, a.shape[0] // 4)

    def call() -> torch.Tensor:
        calls[0] += 1
        if calls[0] <= 2:
            torch.matmul(a, b, out=out)
        else:
            torch.matmul(a[:rows], b, out=out[:rows])
        return out

    return call


def _needs_gpu() -> str | None:
    """Why the GPU-only backends cannot run here (they are skipped with it), or None."""
    return None if torch.cuda.is_available() else "needs a CUDA GPU (a second stream, an L2 window)"


def _side_stream(a: torch.Tensor, b: torch.Tensor) -> Call:
    side = torch.cuda.Stream(device=a.device)
    out = torch.empty(a.shape[0], b.shape[1], device=a.device)

    def call() -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():  # never joined back: no graph can hold it
            raise RuntimeError("side_stream: the second stream is not joined, not capturable")
        side.wait_stream(torch.cuda.current_stream())  # the inputs are ready; nothing waits back
        with torch.cuda.stream(side):
            torch.matmul(a, b, out=out)
        return out

    return call


def _persisting_l2(a: torch.Tensor, b: torch.Tensor) -> Call:
    from testkit.kernels.l2_window import keep_in_l2

    def call() -> torch.Tensor:
        keep_in_l2(a, b)
        return a @ b

    return call


BACKENDS = Backends("adversarial")
BACKENDS.add("honest", "torch.matmul, every call", reference=True, impl=_honest)
BACKENDS.add("cached", "the product computed once, before the timed calls", impl=_cached)
BACKENDS.add("replay", "the first call's result, replayed", impl=_replay)
BACKENDS.add("threaded", "the product computed by a helper thread", impl=_threaded)
BACKENDS.add("lazy", "a quarter of the rows once the checks are past", impl=_lazy)
GPU_ONLY = {"requires": _needs_gpu}
BACKENDS.add("side_stream", "the product on a stream nothing waits for", impl=_side_stream, **GPU_ONLY)
BACKENDS.add("persisting_l2", "a persisting L2 window over the inputs", impl=_persisting_l2, **GPU_ONLY)


class AdversarialFamily(KernelFamily):
    name = "adversarial"
    backends = BACKENDS
    shape_keys = ("m", "n", "k")

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        if set(shape) != set(self.shape_keys) or not all(
            isinstance(v, int) and v > 0 for v in shape.values()
        ):
            raise ValueError(f"shape needs positive integers m, n, k (got {shape})")
        if config or dtype != "float32":
            raise ValueError(f"adversarial takes no config and float32 only (got {config}, {dtype})")

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        m, n, k = shape["m"], shape["n"], shape["k"]
        return Cost(flops=2.0 * m * n * k, bytes_read=4.0 * (m * k + k * n), bytes_written=4.0 * m * n)

    def execute(self, req: TrialRequest) -> TrialOutcome:
        build = self.backends.impl(req.backend)
        m, n, k = req.shape["m"], req.shape["n"], req.shape["k"]

        def prepare(seed: int, device: torch.device) -> Prepared:
            gen = torch.Generator().manual_seed(seed)
            a, b = torch.randn(m, k, generator=gen).to(device), torch.randn(k, n, generator=gen).to(device)
            reference = a @ b

            def check(out: torch.Tensor) -> Checked:
                if out.is_cuda:  # the output of a side stream is read once the whole device is done
                    torch.cuda.synchronize(out.device)
                return Checked(check_allclose(out, reference))

            return Prepared(
                call=build(a, b),
                check=check,
                cost=self.cost(req.shape, req.dtype),
                inputs=(a, b),
            )

        return run_trial(req, prepare, precision="fp32")


FAMILY = AdversarialFamily()
