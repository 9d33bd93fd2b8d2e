"""SM clock and throttle-reason sampling through nvidia-ml-py (`pynvml`), when it is installed.

Clocks throttle under load (REFERENCE.md: 1980 MHz down to ~1600 MHz), the main source of run-to-run
variance, so every GPU sample carries the SM clock read right after it. A sample is throttled when that
clock is below `fraction` x the default SM clock (the default applications clock, else the max clock).
Without pynvml or a GPU, `ClockSampler.open` returns a sampler that reads nothing and says why.
"""

from __future__ import annotations

import os
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


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


@dataclass
class ClockSampler:
    fraction: float = 0.75
    reason: str | None = None  # why nothing can be read; None when reading works
    default_mhz: float | None = None
    sm_mhz: list[float] = field(default_factory=list)
    reasons_seen: int = 0
    _nvml: Any = None
    _handle: Any = None

    @classmethod
    def unavailable(cls, reason: str, fraction: float = 0.75) -> ClockSampler:
        return cls(fraction=fraction, reason=reason)

    @classmethod
    def open(cls, device_index: int, fraction: float = 0.75) -> ClockSampler:
        """A sampler for the torch CUDA device `device_index` (mapped to NVML by UUID when possible)."""
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            return cls.unavailable("nvidia-ml-py (pynvml) is not installed", fraction)
        try:
            pynvml.nvmlInit()
            handle = _nvml_handle(pynvml, device_index)
            sm = pynvml.NVML_CLOCK_SM
            try:
                default = float(pynvml.nvmlDeviceGetDefaultApplicationsClock(handle, sm))
            except pynvml.NVMLError:
                default = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, sm))
        except Exception as exc:  # NVML missing, no permission, driver mismatch ...
            return cls.unavailable(f"NVML unavailable: {exc}", fraction)
        return cls(fraction=fraction, default_mhz=default, _nvml=pynvml, _handle=handle)

    @property
    def available(self) -> bool:
        return self.reason is None

    def sample(self) -> bool:
        """Read the SM clock now; True when it is below the throttle threshold. False if unreadable."""
        if not self.available:
            return False
        try:
            mhz = float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
            # gpu_idle (0x1) is set whenever the clock is read between kernels: not a throttle
            self.reasons_seen |= int(_throttle_mask(self._nvml, self._handle)) & ~0x1
        except Exception as exc:
            self.reason = f"NVML read failed: {exc}"
            return False
        self.sm_mhz.append(mhz)
        return self.default_mhz is not None and mhz < self.fraction * self.default_mhz

    def to_dict(self) -> dict[str, Any]:
        if not self.available and not self.sm_mhz:
            return {"available": False, "reason": self.reason}
        out: dict[str, Any] = {
            "available": True,
            "sm_mhz": list(self.sm_mhz),
            "min_mhz": min(self.sm_mhz) if self.sm_mhz else None,
            "max_mhz": max(self.sm_mhz) if self.sm_mhz else None,
            "default_mhz": self.default_mhz,
            "throttle_fraction": self.fraction,
            "throttle_reasons": reason_names(self.reasons_seen),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


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
