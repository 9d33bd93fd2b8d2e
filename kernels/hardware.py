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


# Dense peaks per precision: tensor-core bf16/fp16/fp8 and TF32; "fp32" is the non-tensor FP32 rate
# (IEEE fp32 dots, as the Triton kernels run float32 inputs, do not use the tensor cores).
HOPPER_TFLOPS = {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.5, "fp32": 67.0}
H100 = DeviceLimits("H100/H800 SXM", 3350.0, dict(HOPPER_TFLOPS), 132, 228, 227, 50)
H200 = DeviceLimits("H200 SXM", 4800.0, dict(HOPPER_TFLOPS), 132, 228, 227, 60)

# torch dtype names -> the precision keys of DeviceLimits.dense_tflops
PRECISIONS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}


def precision_of(dtype: str) -> str:
    """The peak-table key of a trial dtype ("float32" -> "fp32"); a dtype with no entry is an error, so
    no trial is silently held against another precision's peak."""
    if dtype not in PRECISIONS:
        raise ValueError(f"no peak TFLOPS entry for dtype {dtype!r} (known: {sorted(PRECISIONS)})")
    return PRECISIONS[dtype]


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
