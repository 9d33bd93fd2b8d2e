"""What a worker runs on: host, device model, driver, CUDA and library versions, clocks."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a missing or broken optional package is just "not present"
        return None


def _nvidia_smi(gpu_index: int) -> dict[str, Any]:
    """Driver and clocks from nvidia-smi when it is on PATH; {} otherwise."""
    fields = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={gpu_index}", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.split(",")]
    return dict(
        zip(
            ["driver", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "power_limit_w"],
            values,
            strict=False,
        )
    )


def collect(threads: int | None = None) -> dict[str, Any]:
    """The environment of the current process. Stable for one worker, so it is stored once per content."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "ray": _version("ray"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_kind="gpu",
            device_name=props.name,
            gpu_count=torch.cuda.device_count(),
            cuda=torch.version.cuda,
            sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
            l2_bytes=getattr(props, "L2_cache_size", None),
            capability=f"{props.major}.{props.minor}",
        )
        visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        env.update(_nvidia_smi(int(visible)) if visible.isdigit() else {})
    else:
        env.update(
            device_kind="cpu",
            device_name=env["cpu_model"],
            gpu_count=0,
            cuda=None,
            torch_threads=threads or torch.get_num_threads(),
        )
    return env
