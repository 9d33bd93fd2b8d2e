"""What a timed GPU call must not do: move data between the host and the device, or wait for the device
(``.item()``, ``.tolist()``, ``.cpu()``, a ``.to()`` or ``copy_`` across devices). Each of them stalls the
stream inside every timed sample and breaks CUDA-graph capture. ``transfers(fn)`` runs ``fn`` once under
a torch function mode that records them; kernels.measure.timing refuses a callable that does any, naming
it, before anything is timed (the fix is to do that work once, when the inputs are built)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

_SYNCING = {
    torch.Tensor.item: "Tensor.item() waits for the device",
    torch.Tensor.tolist: "Tensor.tolist() copies to the host",
    torch.Tensor.cpu: "Tensor.cpu() copies to the host",
    torch.Tensor.numpy: "Tensor.numpy() needs host memory",
    torch.Tensor.cuda: "Tensor.cuda() copies to the device",
}


def _device_of(value: object) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            return torch.device(value)
        except RuntimeError:
            return None  # a dtype name or the like
    if isinstance(value, torch.Tensor):
        return value.device
    return None


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNCING and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
            self.found.append(_SYNCING[func])
        elif func is torch.Tensor.cuda and args and isinstance(args[0], torch.Tensor):
            self.found.append(_SYNCING[func])
        elif func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            target = _device_of(kwargs.get("device")) or next(
                (d for d in map(_device_of, args[1:]) if d is not None), None
            )
            if target is not None and not _same(target, args[0].device):
                self.found.append(f"Tensor.to({target}) of a tensor on {args[0].device} copies it")
        elif func is torch.Tensor.copy_ and len(args) > 1 and isinstance(args[1], torch.Tensor):
            if not _same(args[0].device, args[1].device):
                self.found.append(f"copy_ from {args[1].device} to {args[0].device}")
        return func(*args, **kwargs)


class _Everything(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def torch_calls(fn: Callable[[], object]) -> list[str]:
    """The torch functions and tensor methods one call of ``fn`` makes, in order: what a test asserts
    about a timed call that must run a kernel only (a re-layout or an allocation shows up here)."""
    with _Everything() as rec:
        fn()
    return rec.calls


def transfers(fn: Callable[[], object]) -> list[str]:
    """The host-device copies and waits one call of ``fn`` makes, in order (each named once)."""
    with _Recorder() as rec:
        fn()
    return list(dict.fromkeys(rec.found))
