"""What a worker runs on: host, device model and count, driver, CUDA and library versions, the clocks policy,
the CPU model and its frequency governor, and the kernel source it runs (the digest of its kernels/, as
cluster.shipping names a shipped one). The judge compares two of these (jobs.judge.environment)."""

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


GOVERNOR = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"


def cpu_governor(path: str = GOVERNOR) -> str | None:
    """The CPU frequency governor (performance, powersave, ...); None where the kernel exposes none."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a missing or broken optional package is just "not present"
        return None


def _nvidia_smi(gpu_index: int) -> dict[str, Any]:
    """Driver and clocks from nvidia-smi when it is on PATH; {} otherwise."""
    fields = (
        "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,"
        "clocks.applications.graphics,clocks.default_applications.graphics"
    )
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
    names = ["driver", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "power_limit_w", "app_clock_mhz"]
    found = dict(zip([*names, "default_app_clock_mhz"], values, strict=False))
    app, default = found.pop("app_clock_mhz", None), found.pop("default_app_clock_mhz", None)
    found["clocks_policy"] = clocks_policy(app, default, found.get("power_limit_w"))
    return found


def clocks_policy(app_mhz: str | None, default_mhz: str | None, power_w: str | None) -> str:
    """The clocks a GPU is held to, in words: its application clocks (the default, or set to N MHz) and
    its power limit. What a sample's clock reading (sm_clock_mhz) is not: a setting, stable for a worker."""
    if app_mhz is None or default_mhz is None:
        clocks = "clocks not reported"
    else:
        clocks = "default clocks" if app_mhz == default_mhz else f"application clocks {app_mhz} MHz"
    return clocks + (f", power limit {power_w} W" if power_w else "")


def collect(threads: int | None = None, kernels_source: str | None = None) -> dict[str, Any]:
    """The environment of the current process. Stable for one worker, so it is stored once per content.
    `kernels_source`: the digest of the kernels/ the worker runs (cluster.shipping.source_digest)."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_governor": cpu_governor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "ray": _version("ray"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "kernels_source": kernels_source,
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
