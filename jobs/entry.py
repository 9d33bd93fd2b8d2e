"""The ``farm`` executable. ``farm gateway ...`` goes straight to the gateway's commands, so the gateway
(a separate service) starts without importing the farm's torch, Ray and SciPy code; everything else is
the farm's CLI (jobs.cli), which also lists ``gateway`` in its help."""

from __future__ import annotations

import sys


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "gateway":
        try:
            from gateway.ops.cli import gateway
        except ImportError:  # the farm runs without the gateway package: let jobs.cli say so
            pass
        else:
            gateway.main(args=sys.argv[2:], prog_name="farm gateway")
            return
    from jobs.cli import main as farm

    farm()


if __name__ == "__main__":
    main()
