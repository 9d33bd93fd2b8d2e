"""cluster.session: what a driver loads before it starts or joins Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER = not any(Path(p).exists() for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg"))


@pytest.mark.skipif(not NO_DRIVER, reason="an NVIDIA driver here: torch counts its devices")
def test_a_driver_reading_a_spec_on_a_host_without_cuda_loads_neither_torch_nor_scipy():
    # A sweep's driver never times anything: on a CPU host it counts no devices and parses the spec
    # without the 1.3 s of torch and the 1.4 s of SciPy that its workers load.
    script = (
        "import sys\n"
        "from cluster.session import _cuda_count\n"
        "from jobs.spec.sweep import load_spec\n"
        "assert _cuda_count() == 0\n"
        "assert len(load_spec('jobs/specs/probe.yaml').trials()) == 12\n"
        "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
