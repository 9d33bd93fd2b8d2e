"""The test suite's injected faults, as a FARM_PLUGINS module (kernels.registry): importing it wraps product
backends (kernels.base.Backends.wrap) so that a trial's config can ask for a fault. Each fault key is a
variant key of its backend: a faulty trial is the same point as the untouched one, so baselines, anomaly
fingerprints and history pair them (that is what lets a test inject a slowdown into "the same point").

  gemm torch_fp32, torch_bf16
    _repeat: N     the matmul N times per call (N >= 1; the timed call and the checked call alike): a real
                   slowdown of about N x, with a correct result
    _perturb: x    x added to the first element of the output: a wrong result (x != 0)
  probe spin, wait
    _slowdown: x   config.ms x (1 + x) milliseconds (of CPU time, of wall time): a real slowdown of x
                   (0.2 = 20% slower); spin's is exact in CPU time whatever else runs on the machine
  paged_mla triton
    _overread: n   the kernel reads n slots past every sequence's end (testkit.kernels.broken)

  adversarial      a family of its own (testkit.kernels.adversarial): backends that cache or replay results

The tests name this module in FARM_PLUGINS for their process, Ray workers and subprocesses
(tests/conftest.py); a benchmark that injects faults calls `enable()` before it starts Ray.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from kernels.registry import PLUGINS_ENV, extend, register_family


def enable() -> None:
    """Name this module in FARM_PLUGINS, for the Ray workers and subprocesses this process starts."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    if __name__ not in names:
        os.environ[PLUGINS_ENV] = ",".join([*names, __name__])


def _number(config: dict[str, Any], key: str, ok: Callable[[Any], bool], want: str) -> None:
    value = config.get(key)
    if key in config and (isinstance(value, bool) or not isinstance(value, int | float) or not ok(value)):
        raise ValueError(f"config.{key} must be {want} (got {value!r})")


# ---- gemm: a slower or a wrong matmul -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _FaultyMatmul:
    inner: Any  # kernels.gemm.case.Matmul

    @property
    def dtype(self) -> Any:
        return self.inner.dtype

    def __call__(self, a: Any, b: Any, config: dict[str, Any]) -> Callable[[], Any]:
        call = self.inner(a, b, config)
        repeat, perturb = int(config.get("_repeat", 1)), float(config.get("_perturb", 0.0))

        def faulty() -> Any:
            out = call()
            for _ in range(repeat - 1):
                out = call()
            if perturb:
                out.view(-1)[0] += perturb
            return out

        return faulty


def _check_gemm(shape: dict[str, Any], config: dict[str, Any]) -> None:
    _number(config, "_repeat", lambda n: isinstance(n, int) and n >= 1, "an integer >= 1")
    _number(config, "_perturb", lambda x: True, "a number")


# ---- probe: a proportional slowdown -------------------------------------------------------------------


def _slowed(build: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    def slowed(config: dict[str, Any]) -> Any:
        x = float(config.get("_slowdown", 0.0))
        plain = {k: v for k, v in config.items() if k != "_slowdown"}
        return build({**plain, "ms": float(config.get("ms", 1.0)) * (1 + x)})

    return slowed


def _check_probe(shape: dict[str, Any], config: dict[str, Any]) -> None:
    _number(config, "_slowdown", lambda x: 0 <= x <= 100, "a number from 0 to 100")


# ---- paged_mla: a kernel that reads past the end ------------------------------------------------------


def _overreading(impl: Any) -> Any:
    """The decode backend (kernels.paged_mla.case.DecodeBackend) with its build fed longer lengths."""
    build = impl.build

    def overread(inp: Any, config: dict[str, Any], device: Any) -> Any:
        n = int(config.get("_overread", 0))
        if n:
            from testkit.kernels.broken import overread_lengths  # torch: with the family, not the plugin

            lens, seqlens = overread_lengths(inp.cache_seqlens, inp.seqlens, n)
            inp = dataclasses.replace(inp, cache_seqlens=lens, seqlens=seqlens)
        return build(inp, config, device)

    return dataclasses.replace(impl, build=overread)


def _check_overread(shape: dict[str, Any], config: dict[str, Any]) -> None:
    _number(config, "_overread", lambda n: isinstance(n, int) and n >= 0, "an integer >= 0")


def _gemm(family: Any) -> None:
    for name in ("torch_fp32", "torch_bf16"):
        keys = ("_repeat", "_perturb")
        family.backends.wrap(name, _FaultyMatmul, config_keys=keys, variant_keys=keys, check=_check_gemm)


def _probe(family: Any) -> None:
    for name in ("spin", "wait"):
        keys = ("_slowdown",)
        family.backends.wrap(name, _slowed, config_keys=keys, variant_keys=keys, check=_check_probe)


def _paged_mla(family: Any) -> None:
    keys = ("_overread",)
    family.backends.wrap("triton", _overreading, config_keys=keys, variant_keys=keys, check=_check_overread)


# each family is wrapped when a process first asks for it (kernels.registry.extend): a driver reading a
# spec imports no family, and no torch, it does not need
extend("gemm", _gemm)
extend("probe", _probe)
extend("paged_mla", _paged_mla)
# and a family of backends written to look fast, which the harness must store invalid (issue 45)
register_family("adversarial", "testkit.kernels.adversarial")
