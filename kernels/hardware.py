"""Published limits of the GPUs the farm targets (dense figures; datasheet sparsity figures are 2x)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    hbm_gbps: float
    dense_tflops: dict[str, float]
    sms: int
    smem_per_sm_kb: int
    smem_per_block_kb: int
    l2_mb: int


H100 = DeviceLimits("H100/H800 SXM", 3350.0, {"bf16": 989.0, "fp8": 1979.0}, 132, 228, 227, 50)
H200 = DeviceLimits("H200 SXM", 4800.0, {"bf16": 989.0, "fp8": 1979.0}, 132, 228, 227, 60)


# The SM count the split heuristics and wave counts assume when no device is at hand (H100/H800/H200).
HOPPER_SMS = H100.sms


def triton_interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET set and not "0")."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def limits_for(device_name: str | None) -> DeviceLimits | None:
    """Limits for a device name as torch reports it ("NVIDIA H100 80GB HBM3"), or None if unknown."""
    if not device_name:
        return None
    name = device_name.upper()
    if "H200" in name:
        return H200
    if "H100" in name or "H800" in name:
        return H100
    return None


def device_limits(device: object) -> DeviceLimits | None:
    """Limits of a torch device when it is a GPU of known limits; None for a CPU or an unknown GPU."""
    import torch

    device = torch.device(device)  # type: ignore[arg-type]
    if device.type != "cuda":
        return None
    return limits_for(torch.cuda.get_device_name(device))
