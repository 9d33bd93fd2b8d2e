"""SM clock and throttle-reason sampling through nvidia-ml-py (`pynvml`, a dependency of the farm).

Clocks throttle under load (REFERENCE.md: 1980 MHz down to ~1600 MHz), the main source of run-to-run
variance, so the SM clock is read once when the run starts and once after every batch of GPU samples
(`sm_mhz`, one value per batch). A batch is throttled when its clock fell more than `max_drop` (policy
`throttle_max_drop`, 5%) below the clock the run started with: the run is compared with itself, not
with a datasheet clock that the usual ~1.6 GHz sustained clock would never fall below.

The reading itself is a `ClockSource` (a callable returning MHz, and one returning the NVML throttle
reason bits), so the bookkeeping is testable without a GPU; `ClockSampler.open` builds the NVML one.
Without pynvml or a GPU it returns a sampler that reads nothing and says why.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# NVML clocks-event (throttle) reason bits, by name. Values are the documented NVML bit flags.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
DEFAULT_MAX_DROP = 0.05


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def is_throttled(mhz: float, start_mhz: float | None, max_drop: float = DEFAULT_MAX_DROP) -> bool:
    """The throttle rule: more than `max_drop` below the clock the run started with."""
    return start_mhz is not None and mhz < (1.0 - max_drop) * start_mhz


@dataclass(frozen=True)
class ClockSource:
    """Where clocks come from: `sm_mhz()` reads the SM clock now, `reasons()` the throttle reason bits."""

    sm_mhz: Callable[[], float]
    reasons: Callable[[], int] = lambda: 0
    default_mhz: float | None = None  # the datasheet / application clock, for the record only


@dataclass
class ClockSampler:
    max_drop: float = DEFAULT_MAX_DROP
    reason: str | None = None  # why nothing can be read; None when reading works
    source: ClockSource | None = None
    start_mhz: float | None = None  # the SM clock when the run started (the throttle baseline)
    sm_mhz: list[float] = field(default_factory=list)  # one reading per batch of samples
    throttled_batches: int = 0
    reasons_seen: int = 0

    @classmethod
    def unavailable(cls, reason: str, max_drop: float = DEFAULT_MAX_DROP) -> ClockSampler:
        return cls(max_drop=max_drop, reason=reason)

    @classmethod
    def start(cls, source: ClockSource, max_drop: float = DEFAULT_MAX_DROP) -> ClockSampler:
        """A sampler over `source`, its baseline read now (call it when the measured run starts)."""
        sampler = cls(max_drop=max_drop, source=source)
        try:
            sampler.start_mhz = float(source.sm_mhz())
        except Exception as exc:
            return cls.unavailable(f"clock read failed at start: {exc}", max_drop)
        return sampler

    @classmethod
    def open(cls, device_index: int, max_drop: float = DEFAULT_MAX_DROP) -> ClockSampler:
        """A started sampler for the torch CUDA device `device_index` (mapped to NVML by UUID)."""
        source = nvml_source(device_index)
        if isinstance(source, str):
            return cls.unavailable(source, max_drop)
        return cls.start(source, max_drop)

    @property
    def available(self) -> bool:
        return self.reason is None

    def sample(self) -> bool:
        """Read the SM clock after a batch; True when the batch ran throttled. False if unreadable."""
        if not self.available or self.source is None:
            return False
        try:
            mhz = float(self.source.sm_mhz())
            # gpu_idle (0x1) is set whenever the clock is read between kernels: not a throttle
            self.reasons_seen |= int(self.source.reasons()) & ~0x1
        except Exception as exc:
            self.reason = f"clock read failed: {exc}"
            return False
        self.sm_mhz.append(mhz)
        hot = is_throttled(mhz, self.start_mhz, self.max_drop)
        self.throttled_batches += hot
        return hot

    def to_dict(self) -> dict[str, Any]:
        if not self.available and not self.sm_mhz:
            return {"available": False, "reason": self.reason}
        out: dict[str, Any] = {
            "available": True,
            "start_mhz": self.start_mhz,
            "sm_mhz": list(self.sm_mhz),
            "min_mhz": min(self.sm_mhz) if self.sm_mhz else None,
            "max_mhz": max(self.sm_mhz) if self.sm_mhz else None,
            "default_mhz": self.source.default_mhz if self.source else None,
            "throttle_max_drop": self.max_drop,
            "throttled_batches": self.throttled_batches,
            "throttle_reasons": reason_names(self.reasons_seen),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def nvml_source(device_index: int) -> ClockSource | str:
    """The NVML clock source of a torch CUDA device, or the reason there is none."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, device_index)
        sm = pynvml.NVML_CLOCK_SM
        try:
            default: float | None = float(pynvml.nvmlDeviceGetDefaultApplicationsClock(handle, sm))
        except pynvml.NVMLError:
            default = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, sm))
    except Exception as exc:  # NVML missing, no permission, driver mismatch ...
        return f"NVML unavailable: {exc}"
    return ClockSource(
        sm_mhz=lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, sm)),
        reasons=lambda: _throttle_mask(pynvml, handle),
        default_mhz=default,
    )


def _nvml_handle(pynvml: Any, device_index: int) -> Any:
    import torch

    props = torch.cuda.get_device_properties(device_index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        raise RuntimeError("cannot map the torch device to NVML (no UUID and CUDA_VISIBLE_DEVICES is set)")
    return pynvml.nvmlDeviceGetHandleByIndex(device_index)


def _throttle_mask(pynvml: Any, handle: Any) -> int:
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(pynvml, name, None)
        if fn is not None:
            return int(fn(handle))
    return 0
