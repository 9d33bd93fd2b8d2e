"""Compiled evidence: build a Triton kernel for a GPU target on any machine, exactly as the JIT would at
launch, and read what the compiler made of it.

    python -m kernels.compiled jobs/specs/fp8_gemm.yaml [--target sm_90a]

How "exactly as the JIT would": the family's own launch code runs with `meta` tensors (shapes and
strides, no storage; data_ptr() is 0, so 16-byte aligned like every CUDA allocation) under `capturing`.
That swaps Triton's active driver for a compile-only one reporting the target, and sets Triton's
`jit_cache_hook`, which the JIT calls with the launch's signature, constexprs, attributes (integers
divisible by 16, integers equal to 1) and options (num_warps, num_stages, ...) just before it would
compile; the hook records them and tells the JIT to skip compiling and launching. `compile_launch` then
calls `triton.compile` on the same ASTSource with the same options, as `JITFunction._do_compile` does.

What is read (`Evidence`):
  regs, stack   registers per thread and the local-memory stack from the cubin (`cuobjdump
                --dump-resource-usage`, bundled with Triton); a stack > 0 means spills (Triton kernels
                make no calls and use no local arrays). `n_regs` / `n_spills` on a compiled kernel are
                filled in only when a driver loads it, so they need a GPU: the cubin is the CPU's source.
  shared        bytes of shared memory per block (compile metadata), against the target's per-block limit
  wgmma         the PTX holds warpgroup MMAs (SM90 tensor cores, asynchronous) rather than mma.sync
  tcgen05       the PTX holds tcgen05 MMAs (SM100 tensor cores, accumulator in tensor memory)
  tma           cp.async.bulk.tensor (TMA) in the PTX;  cp_async: cp.async (Ampere-style async copies)
`problems()` lists what makes a config unfit to run: spills, shared memory over the limit.

Targets: sm_90a (H100/H200, the farm's reference) and sm_100a (B200). This Triton (3.7.1) builds both on
a CPU-only machine: its bundled ptxas knows sm_100a, so the same capture and compile work unchanged
(tests/kernels/test_compiled.py compiles every shipped GPU config for sm_90a and one representative
launch per family for sm_100a).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

TARGETS = {"sm_90a": ("cuda", 90, 32), "sm_100a": ("cuda", 100, 32)}
SMEM_LIMITS = {"sm_90a": 232448, "sm_100a": 232448}  # bytes per block (227 KB) on H100/H200 and B200
_CAPTURE_TARGET: ContextVar[str | None] = ContextVar("capture_target", default=None)  # inside `capturing`


def interpreter_reason() -> str | None:
    """Why kernels cannot be compiled in this process (None when they can)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not importable"
    from triton import knobs

    if knobs.runtime.interpret:
        return "TRITON_INTERPRET is set: @triton.jit functions are interpreted, not compiled"
    return None


def target_of(name: str) -> Any:
    from triton.backends.compiler import GPUTarget

    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return GPUTarget(*TARGETS[name])


@dataclass(frozen=True)
class Launch:
    """What the JIT would compile for one launch: the kernel and its specialisation."""

    fn: Any  # the JITFunction
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[tuple[int, ...], Any], ...]
    attrs: tuple[tuple[tuple[int, ...], Any], ...]
    options: tuple[tuple[str, Any], ...]
    target: str

    @property
    def name(self) -> str:
        return self.fn.__name__

    def option(self, key: str) -> Any:
        return dict(self.options)[key]


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


class _CompileOnlyDriver:
    """Enough of a Triton driver for the JIT to specialise and reach its compile hook: no device."""

    def __init__(self, target_name: str):
        self.target_name = target_name
        self.target = target_of(target_name)

    def get_current_device(self) -> str:
        return f"compile-only:{self.target_name}"  # keeps these entries apart from a real device's cache

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


@contextmanager
def capturing(target: str = "sm_90a") -> Iterator[list[Launch]]:
    """Record every Triton launch made inside the block instead of compiling and running it."""
    reason = interpreter_reason()
    if reason:
        raise RuntimeError(f"cannot compile kernels here: {reason}")
    from triton import knobs
    from triton.runtime import driver

    launches: list[Launch] = []

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        jit = fn.jit_function
        opts = {
            k: compile[k]
            for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion", "launch_cooperative_grid")
        }
        import json

        spec = json.loads(compile["specialization_data"])
        launches.append(
            Launch(
                fn=jit,
                signature=_frozen(compile["signature"]),
                constexprs=_frozen(compile["constants"]),
                attrs=_frozen(compile["configs"][0]),
                options=_frozen({**spec["options"], **opts}),
                target=target,
            )
        )
        return True  # the JIT skips compiling and launching

    previous_driver, previous_hook = driver._active, knobs.runtime.jit_cache_hook
    driver.set_active(_CompileOnlyDriver(target))  # type: ignore[arg-type]
    knobs.runtime.jit_cache_hook = hook
    token = _CAPTURE_TARGET.set(target)
    try:
        yield launches
    finally:
        _CAPTURE_TARGET.reset(token)
        knobs.runtime.jit_cache_hook = previous_hook
        driver._active = previous_driver


def launches_of(call: Callable[[], Any], target: str = "sm_90a") -> list[Launch]:
    """The launches `call` makes (run it with meta tensors), as the JIT would specialise them."""
    with capturing(target) as launches:
        call()
    return launches


@dataclass
class Evidence:
    kernel: str
    target: str
    num_warps: int
    num_stages: int
    regs: int
    stack: int
    shared: int
    smem_limit: int
    wgmma: bool
    mma_sync: bool
    tcgen05: bool
    tma: bool
    cp_async: bool
    specialised: dict[str, str] = field(default_factory=dict)  # argument -> "D" (div. by 16) / "1"

    @property
    def spills(self) -> bool:
        return self.stack > 0

    def problems(self) -> list[str]:
        out = []
        what = f"{self.kernel} (num_warps={self.num_warps}, num_stages={self.num_stages}) on {self.target}"
        if self.spills:
            out.append(f"compiled {what} spills: {self.stack} B of local stack at {self.regs} registers")
        if self.shared > self.smem_limit:
            out.append(f"compiled {what} needs {self.shared} B of shared memory > {self.smem_limit} B")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spills": self.spills}


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def cubin_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread and local stack bytes of the (single-kernel) cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True, check=False
        ).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if match is None:
        raise RuntimeError(f"no resource usage in cuobjdump output: {text[-300:]}")
    return {"regs": int(match.group(1)), "stack": int(match.group(2))}


@functools.cache
def compile_launch(launch: Launch) -> tuple[Evidence, Any]:
    """Compile one captured launch (cached per distinct specialisation) -> (evidence, compiled kernel)."""
    import triton
    from triton.compiler import ASTSource

    src = ASTSource(launch.fn, dict(launch.signature), dict(launch.constexprs), _attrs(launch.attrs))
    compiled = triton.compile(src, target=target_of(launch.target), options=dict(launch.options))
    ptx = compiled.asm["ptx"]
    usage = cubin_usage(compiled.asm["cubin"])
    names = launch.fn.arg_names
    specialised = {}
    for path, attr in launch.attrs:
        tags = {a[0] for a in attr}
        if "tt.divisibility" in tags and len(path) == 1:
            specialised[names[path[0]]] = "D"
    for path, value in launch.constexprs:
        if len(path) == 1 and not launch.fn.params[path[0]].is_constexpr and value == 1:
            specialised[names[path[0]]] = "1"  # an integer argument equal to 1 becomes a constant
    evidence = Evidence(
        kernel=launch.name,
        target=launch.target,
        num_warps=int(launch.option("num_warps")),
        num_stages=int(launch.option("num_stages")),
        regs=usage["regs"],
        stack=usage["stack"],
        shared=int(compiled.metadata.shared),
        smem_limit=SMEM_LIMITS[launch.target],
        wgmma="wgmma.mma_async" in ptx,
        mma_sync="mma.sync" in ptx,
        tcgen05="tcgen05.mma" in ptx,
        tma="cp.async.bulk.tensor" in ptx,
        cp_async="cp.async" in ptx,
        specialised=specialised,
    )
    return evidence, compiled


def _attrs(attrs: tuple[Any, ...]) -> dict[tuple[int, ...], list[list[Any]]]:
    return {tuple(path): [list(a) for a in attr] for path, attr in attrs}


def evidence_of(call: Callable[[], Any], target: str = "sm_90a") -> list[Evidence]:
    """Compile every launch `call` makes, as the JIT would; one Evidence per launch."""
    return [compile_launch(launch)[0] for launch in launches_of(call, target)]


_EACH: list[tuple[Callable[[], Any], str]] = []  # evidence_of_each's calls, inherited by its forked workers


def _evidence_dicts(index: int) -> list[dict[str, Any]] | str:
    call, target = _EACH[index]
    try:
        return [e.to_dict() for e in evidence_of(call, target)]
    except Exception as exc:  # noqa: BLE001 - reported in its place; the other compiles go on
        return f"{type(exc).__name__}: {exc}"


def evidence_of_each(
    calls: Sequence[tuple[Callable[[], Any], str]], processes: int | None = None
) -> list[list[dict[str, Any]] | str]:
    """`evidence_of` for each (call, target), as dicts, compiled in forked processes at once: a compile
    is single-threaded and CPU-bound, so N cores take about 1/N of the time. The calls are inherited
    through fork, so closures need not pickle. A launch that fails to compile gives its error as
    "Type: message" in its place."""
    import multiprocessing

    _EACH[:] = calls
    workers = min(processes or os.cpu_count() or 1, len(_EACH))
    try:
        if workers <= 1:
            return [_evidence_dicts(i) for i in range(len(_EACH))]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_evidence_dicts, range(len(_EACH)), chunksize=1)
    finally:
        _EACH.clear()


def verdict(call: Callable[[], Any], target: str = "sm_90a") -> dict[str, Any]:
    """The compiled check a family runs before a trial: {"checked", "target", "kernels", "problems"}, or
    {"checked": False, "reason"} where nothing can be compiled (the interpreter, no triton)."""
    reason = interpreter_reason()
    if reason:
        return {"checked": False, "reason": reason}
    found = evidence_of(call, target)
    return {
        "checked": True,
        "target": target,
        "kernels": [e.to_dict() for e in found],
        "problems": [p for e in found for p in e.problems()],
    }


def device_target() -> str:
    """The compile target for this host: the GPU's (sm_90a on Hopper, sm_100a on Blackwell), sm_90a
    without a GPU (the farm's reference machine is an H200)."""
    import torch

    if torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability()
        if major == 10:
            return "sm_100a"
    return "sm_90a"


def launch_target() -> str:
    """The target a launch made now is for: the one being captured inside `capturing`, else this host's
    (`device_target`). Launch code that picks per-target defaults (tile sizes) asks this, so the compiled
    check of a target sees the tiles that target would run."""
    return _CAPTURE_TARGET.get() or device_target()


def trial_check(family: Any, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> Any:
    """The compiled check of one trial before it runs: None when the backend launches no Triton kernel
    of ours, {"checked": False, "reason"} where nothing can be compiled, else `verdict` for this host's
    target. A family prunes the trial when the verdict lists problems."""
    call = family.meta_launch(shape, config, dtype, backend)
    if call is None:
        return None
    return verdict(call, device_target())
