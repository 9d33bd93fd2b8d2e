"""``farm gateway ...`` must not load the farm's torch/Ray/SciPy code (seen: 355 MB and 4-7 s to start)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
FARM = {"torch", "ray", "scipy", "triton", "kernels", "cluster"}
sys.argv = ["farm", "gateway", "--help"]
from jobs.entry import main
try:
    main()
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & FARM)
print("HEAVY", heavy)
import gateway.http.app  # what `serve` builds
heavy = sorted({m.split(".")[0] for m in sys.modules} & FARM)
print("HEAVY", heavy)
"""


def test_farm_gateway_imports_none_of_the_farm():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage: farm gateway" in out.stdout
    assert out.stdout.count("HEAVY []") == 2, out.stdout


@pytest.mark.slow  # a fresh farm process
def test_farm_still_lists_the_gateway_and_the_farm_commands():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv=['farm', '--help']; from jobs.entry import main; main()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "gateway" in out.stdout and "sweep" in out.stdout
