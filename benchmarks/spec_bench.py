"""`python -m benchmarks spec`: how long `farm sweep validate` takes to refuse a 10^6-point grid (the
default --max-trials is 10,000), and its peak resident size (issue 32: 183 s and 1.1 GB; target under
5 s and 300 MB).

Spellings of the grid, each in a fresh farm process: two axes of 1000 values (a few KB), one axis of
5 x 10^5 values in flow style (3.4 MB, under the 4 MB spec limit: parsed, then refused for its size), and
three files over the limit, refused unread: one axis of 10^6 values in flow style (`n: [0, 1, ...]`,
8 MB) and in block style (`- 0` a line, 15 MB), and 10^6 points listed under `include` (`- {n: 0}` a line,
18 MB). The time moves with the machine's load; the peak does not."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = 10**6
HEAD = """name: probe-huge
family: probe
backends: [{name: spin, baseline: true}]
configs: {grid: {ms: [0.001]}}
"""
# `farm sweep validate` of the spec at argv[1], then its own peak resident size (VmHWM: ru_maxrss would keep
# the size of a forking parent) on stderr: read it with peak_mb
PEAK_PROGRAM = (
    "import sys\n"
    "from jobs.cli import main\n"
    "try:\n"
    "    main(['sweep', 'validate', sys.argv[1]])\n"
    "finally:\n"
    "    hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
    "    print('PEAK_KB', hwm.split()[1], file=sys.stderr)\n"
)


def peak_mb(stderr: str) -> float:
    """The peak resident size PEAK_PROGRAM printed, in MiB."""
    return int(stderr.split("PEAK_KB")[1].split()[0]) / 1024


def _specs(folder: Path) -> dict[str, Path]:
    specs = {
        "two axes of 1000": HEAD.replace(
            "ms: [0.001]", "ms: [" + ", ".join(f"{0.001 * (i + 1):.3f}" for i in range(1000)) + "]"
        )
        + "shapes: {grid: {n: ["
        + ", ".join(map(str, range(1000)))
        + "]}}\n",
        "axis of 5e5, flow": HEAD + "shapes: {grid: {n: [" + ", ".join(map(str, range(N // 2))) + "]}}\n",
        "axis, flow": HEAD + "shapes: {grid: {n: [" + ", ".join(map(str, range(N))) + "]}}\n",
        "axis, block": HEAD + "shapes:\n  grid:\n    n:\n" + "".join(f"      - {i}\n" for i in range(N)),
        "include": HEAD + "shapes:\n  include:\n" + "".join(f"    - {{n: {i}}}\n" for i in range(N)),
    }
    paths = {}
    for i, (name, text) in enumerate(specs.items()):
        paths[name] = folder / f"grid{i}.yaml"
        paths[name].write_text(text)
    return paths


def main() -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in _specs(Path(tmp)).items():
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", PEAK_PROGRAM, str(path)], capture_output=True, text=True, timeout=900
            )
            seconds = time.perf_counter() - start
            refused = out.returncode == 2 and (
                "trials, more than" in out.stderr or "at most 4 MB" in out.stderr
            )
            how = "for its size" if "at most 4 MB" in out.stderr else "for its trials"
            peak = peak_mb(out.stderr)
            size_mb = path.stat().st_size / 1e6
            print(
                f"{name:18} ({size_mb:4.1f} MB of YAML): {'refused ' + how if refused else 'NOT REFUSED'} in "
                f"{seconds:5.1f} s, peak {peak:5.0f} MB"
            )
            key = name.replace(", ", "_")
            figures[f"{key}_s"] = round(seconds, 2)
            figures[f"{key}_peak_mb"] = round(peak)
    return figures


if __name__ == "__main__":
    main()
